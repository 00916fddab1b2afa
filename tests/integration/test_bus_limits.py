"""Size limits and poison messages against a real nats-server: what a hostile agent can publish, and
what a service does with a message it cannot handle (issue 10, section 4)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import msgpack
import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import BadRequestError

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import MAX_EVENT_BYTES, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.merger.service import Merger
from tests.conftest import wait_for
from tests.integration.merger_support import merger_settled, publish, read_stream, stream_count
from tests.unit.merger.factories import begin


async def test_the_broker_refuses_an_event_over_the_contract_limit(js: JetStreamContext) -> None:
    subject = S.episode_subject("big", "begin")
    with pytest.raises(BadRequestError, match="maximum"):
        await js.publish(subject, b"\0" * 8_388_548)  # the probe's begin, just under max_payload
    with pytest.raises(BadRequestError, match="maximum"):
        await js.publish(subject, b"\0" * (bus.EPISODE_MSG_BYTES + 1))
    await js.publish(subject, b"\0" * MAX_EVENT_BYTES, headers={"Nats-Msg-Id": "big.agent.0"})
    assert await stream_count(js, S.EPISODES_STREAM) == 1
    info = await js.stream_info(S.SAMPLES_STREAM)  # services' own streams keep the server's limit
    assert info.config.max_msg_size == bus.MAX_MSG_BYTES


async def test_ensure_streams_lowers_the_limit_of_an_existing_stream(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.service_url)
    js = nc.jetstream()
    old = StreamConfig(
        name=S.EPISODES_STREAM,
        subjects=S.STREAM_SUBJECTS[S.EPISODES_STREAM],
        storage=StorageType.FILE,
        max_msg_size=bus.MAX_MSG_BYTES,
        duplicate_window=bus.DUPLICATE_WINDOW_S,
    )
    await js.add_stream(old)  # as an older swarm created it
    await bus.ensure_streams(js)
    assert (await js.stream_info(S.EPISODES_STREAM)).config.max_msg_size == bus.EPISODE_MSG_BYTES
    await nc.close()


async def test_a_dead_letter_too_large_for_the_server_is_truncated_with_a_digest(
    swarm_nats: NatsServer,
) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test-service")
    js = nc.jetstream()
    dlq = bus.DeadLetters(nc, "tester")
    original = bytes(range(256)) * (nc.max_payload // 256)
    original = original[:-50]  # fits the server's max_payload alone, not with the dead letter's headers
    await dlq.send(None, "schema: too big", data=original, subject="swarm.samples.m")
    await dlq.send(None, "schema: small", data=b"small")
    [big, small] = await read_stream(js, S.DLQ_STREAM)
    assert big.data == original[: bus.DEAD_LETTER_KEEP_BYTES]
    assert big.headers[bus.ORIGINAL_SIZE_HEADER] == str(len(original))
    assert big.headers[bus.ORIGINAL_SHA256_HEADER] == hashlib.sha256(original).hexdigest()
    assert big.headers[bus.REASON_HEADER] == "schema: too big"
    assert small.data == b"small" and bus.ORIGINAL_SIZE_HEADER not in (small.headers or {})
    assert nc.is_connected and dlq.counts["schema"] == 2  # the server never closed our connection
    await nc.close()


async def test_the_merger_dead_letters_the_largest_event_the_broker_takes_and_goes_on(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    merger = start_merger(ack_wait_s=4.0)
    padded = msgpack.packb({"v": 1, "kind": "begin", "pad": b"\0" * MAX_EVENT_BYTES})
    await js.publish(S.episode_subject("huge", "begin"), padded)
    await publish(js, begin("after"))
    await wait_for(lambda: "after" in merger.episodes, what="the next episode opened")
    # the two are in different partitions, merged side by side: the dead letter may come second
    await wait_for(lambda: stream_count(js, S.DLQ_STREAM), what="the dead letter")
    [dead] = await read_stream(js, S.DLQ_STREAM)
    assert dead.headers[bus.REASON_HEADER].startswith("oversized:") and dead.data == padded  # whole


async def _consume(url: str, handled: list[str], stop: asyncio.Event) -> None:
    """A service's consume loop whose handler raises on `poison` (a crash: the process ends)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        sub = await bus.durable_pull(js, S.EPISODES_STREAM, "poison-test", ack_wait_s=0.5)
        async for msgs in bus.batches(sub, stop, 16, 0.2, dead_letters=bus.DeadLetters(nc, "tester")):
            for msg in msgs:
                if msg.data == b"poison":
                    raise RuntimeError("handler bug")
                handled.append(msg.data.decode())
                await msg.ack()
                stop.set()
    finally:
        await nc.close()


async def test_a_message_that_crashes_its_consumer_is_dead_lettered_after_bounded_deliveries(
    js: JetStreamContext, swarm_nats: NatsServer
) -> None:
    await js.publish(S.episode_subject("p", "begin"), b"poison")
    handled: list[str] = []
    stop = asyncio.Event()
    crashes = 0

    async def supervise() -> None:  # restarts the service whenever it crashes, as `swarmrl up` does
        nonlocal crashes
        while not stop.is_set():
            assert crashes <= bus.MAX_DELIVERIES, f"still crash-looping after {crashes} restarts"
            try:
                await _consume(swarm_nats.service_url, handled, stop)
            except RuntimeError:
                crashes += 1

    async def then_publish() -> None:
        await wait_for(lambda: stream_count(js, S.DLQ_STREAM), what="the poison message dead-lettered")
        await js.publish(S.episode_subject("p", "end"), b"fine")

    await asyncio.wait_for(asyncio.gather(supervise(), then_publish()), timeout=60)
    assert crashes == bus.MAX_DELIVERIES and handled == ["fine"]
    [dead] = await read_stream(js, S.DLQ_STREAM)
    reason = dead.headers[bus.REASON_HEADER]
    assert reason.startswith(f"poison: delivered {bus.MAX_DELIVERIES + 1} times") and dead.data == b"poison"


async def test_strings_sent_as_msgpack_bin_are_schema_dead_letters(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    start_merger(ack_wait_s=4.0)
    record = msgpack.unpackb(encode(begin("binary")))
    record["task_id"] = record["task_id"].encode()
    data = msgpack.packb(record, use_bin_type=True)
    await js.publish(S.episode_subject("binary", "begin"), data)
    await wait_for(lambda: merger_settled(js), what="merger acked it")
    [dead] = await read_stream(js, S.DLQ_STREAM)
    assert (
        dead.headers[bus.REASON_HEADER]
        == "schema: task_id: msgpack bin where a string is expected (send str)"
    )
    assert dead.data == data
