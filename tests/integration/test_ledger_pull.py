"""How the ledger reads a stream (`pull.BatchPuller` on a `client.PullClient`), against a real nats-server."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.api import AckPolicy

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.ledger import client
from swarmrl.services.ledger.client import PullClient
from swarmrl.services.ledger.pull import BatchPuller
from tests.conftest import wait_for


async def _puller(nc: PullClient, stream: str, durable: str, *, headers: bool) -> BatchPuller:
    js = nc.jetstream()
    sub = await bus.durable_pull(js, stream, durable, S.STREAM_SUBJECTS[stream][0], ack_policy=AckPolicy.ALL)
    await sub.unsubscribe()
    puller = BatchPuller(nc, stream, durable, headers=headers)
    await puller.start()
    return puller


async def test_the_short_path_keeps_order_data_and_acks(swarm_nats: NatsServer, js: JetStreamContext) -> None:
    assert client.SHORT_PATH, "nats-py's _process_msg changed: the ledger reads every message the slow way"
    nc = await bus.connect(swarm_nats.service_url, "test-pull", client=PullClient())
    try:
        fast = await _puller(nc, S.DLQ_STREAM, "fast", headers=False)
        slow = await _puller(nc, S.DLQ_STREAM, "slow", headers=True)  # nats-py's path, on the same connection
        assert len(nc._short) == 2  # the fast puller's batch and doorbell inboxes
        assert await fast.fetch(10) == []  # an empty stream: the status ends the request
        sent = [f"m{i}".encode() for i in range(25)]
        for i, data in enumerate(sent):
            await js.publish(S.dlq_subject("test"), data, headers={"Nats-Msg-Id": f"id{i}", "X-Why": "x"})
        got = await fast.fetch(10) + await fast.fetch(100)
        assert [m.data for m in got] == sent and [m.seq for m in got] == list(range(1, 26))
        assert all(m.headers is None and m.subject == S.dlq_subject("test") for m in got)
        assert [m.data for m in await slow.fetch(100)] == sent
        assert (await slow.fetch(100)) == []
        await nc.publish(got[-1].reply)  # one cumulative ack covers them all

        async def all_acked() -> bool:
            info = await js.consumer_info(S.DLQ_STREAM, "fast")
            return info.num_ack_pending == 0 and info.ack_floor.stream_seq == 25

        await wait_for(all_acked, what="the cumulative ack")
        headed = await _puller(nc, S.DLQ_STREAM, "headed", headers=True)
        assert (await headed.fetch(1))[0].headers == {"Nats-Msg-Id": "id0", "X-Why": "x"}
    finally:
        await nc.close()


async def test_the_doorbell_rings_with_the_next_message(swarm_nats: NatsServer, js: JetStreamContext) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test-bell", client=PullClient())
    try:
        puller = await _puller(nc, S.DLQ_STREAM, "bell", headers=False)
        stop = asyncio.Event()
        assert not await puller.doorbell(stop, timeout=0.2)  # nothing came: the request expired
        waiting = asyncio.create_task(puller.doorbell(stop, timeout=30))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        for i in range(3):
            await js.publish(S.dlq_subject("test"), f"m{i}".encode(), headers={"Nats-Msg-Id": f"b{i}"})
        assert await asyncio.wait_for(waiting, timeout=10)  # at once, not 30 s later
        got = await puller.fetch(100)  # the doorbell's message first, then the rest, in order
        assert [m.data for m in got] == [b"m0", b"m1", b"m2"]
        stop.set()
        assert not await asyncio.wait_for(puller.doorbell(stop, timeout=30), timeout=10)
    finally:
        await nc.close()
