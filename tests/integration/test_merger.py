"""The merger service in-process against a real nats-server: samples once, drops, dead letters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack
import pytest
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import EndEvent, HeartbeatEvent, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.merger.config import MergerConfig
from swarmrl.services.merger.service import Merger
from tests.conftest import wait_for
from tests.integration.merger_support import (
    awaited_equals,
    chain_episode,
    merge_stats,
    merger_settled,
    publish,
    read_stream,
    samples,
    stream_count,
)
from tests.unit.merger.factories import begin, chain, llm, reward

MERGER = {"episode_timeout_s": 1.5, "ack_wait_s": 4.0}
"""Short timeouts, so the tests see timeouts and redeliveries within seconds."""


@pytest.fixture
async def merger(start_merger: Callable[..., Merger]) -> Merger:
    return start_merger(**MERGER)


async def test_episodes_become_samples_exactly_once(js: JetStreamContext, merger: Merger) -> None:
    for ev in chain_episode("chain", turns=4):
        await publish(js, ev)
    # Two agents on one episode, a heartbeat and a divergent retry by agent a.
    team = [begin("team", agents=["a", "b"]), *chain(2, episode_id="team")]
    team.append(llm([9, 9], [5], agent="a", episode_id="team", seq=2))
    team.append(llm([1, 2, 3], [7], agent="b", episode_id="team", seq=3))
    team.append(HeartbeatEvent(episode_id="team", seq=1, client_id="agent-proc"))
    team.append(EndEvent(episode_id="team", seq=2, client_id="agent-proc"))
    for ev in team:
        await publish(js, ev)
    for ev in [begin("evaluation", eval=True), *chain(2, episode_id="evaluation")]:
        await publish(js, ev)
    await publish(js, EndEvent(episode_id="evaluation", seq=1, client_id="agent-proc"))
    for ev in chain_episode("gave-up", outcome="abort"):
        await publish(js, ev)
    for ev in chain_episode("chain", turns=4):  # an agent re-publishing: de-duplicated by msg id
        await publish(js, ev)

    await wait_for(lambda: merger_settled(js), what="merger acked every event")
    await wait_for(lambda: stream_count(js, S.METRICS_STREAM), what="merge stats")
    stats = {s.episode_id: s for s in await merge_stats(js)}
    assert {k: (v.status, v.timelines_kept, v.reason) for k, v in stats.items()} == {
        "chain": ("merged", 1, ""),
        "team": ("merged", 3, ""),
        "evaluation": ("merged", 0, "eval"),
        "gave-up": ("aborted", 0, "agent crashed"),
    }
    # A trainer counts dropped episodes out of their group by these (no waiting for the group timeout).
    assert (stats["gave-up"].group_key, stats["evaluation"].eval, stats["chain"].eval) == (
        "task-1",
        True,
        False,
    )
    got = await samples(js)
    assert sorted(s.sample_id for s in got) == ["chain.a.m.0", "team.a.m.0", "team.a.m.1", "team.b.m.0"]
    by_id = {s.sample_id: s for s in got}
    assert by_id["chain.a.m.0"].n_calls == 4 and by_id["team.a.m.0"].n_calls == 2
    assert all(m.subject == S.samples_subject("m") for m in await read_stream(js, S.SAMPLES_STREAM))
    assert merger.counts["merged"] == 2 and merger.counts["eval"] == 1 and merger.counts["aborted"] == 1
    assert await stream_count(js, S.DLQ_STREAM) == 0


async def test_silent_episode_times_out_and_late_events_are_dead_lettered(
    js: JetStreamContext, merger: Merger
) -> None:
    events = chain_episode("silent", turns=2)
    for ev in events[:-2]:  # no reward, no end: the agent vanished
        await publish(js, ev)
    await wait_for(lambda: stream_count(js, S.METRICS_STREAM), what="timeout stats")
    [stats] = await merge_stats(js)
    assert (stats.episode_id, stats.status, stats.calls, stats.timelines_kept) == ("silent", "timeout", 2, 0)
    await publish(js, events[-1])  # the end arrives after the timeout
    await wait_for(lambda: stream_count(js, S.DLQ_STREAM), what="late end dead-lettered")
    [dead] = await read_stream(js, S.DLQ_STREAM)
    assert dead.headers[bus.REASON_HEADER].startswith("after_end:") and dead.data == encode(events[-1])
    await wait_for(lambda: merger_settled(js), what="everything acked")
    assert await stream_count(js, S.SAMPLES_STREAM) == 0 and merger.counts["timeout"] == 1


async def test_a_call_that_finishes_after_the_abort_is_dropped_not_dead_lettered(
    js: JetStreamContext, merger: Merger
) -> None:
    events = chain_episode("quit", turns=3, outcome="abort")
    late = [ev for ev in events if ev.kind == "llm"][-1]
    for ev in [e for e in events if e is not late]:
        await publish(js, ev)
    await wait_for(lambda: stream_count(js, S.METRICS_STREAM), what="abort stats")
    await publish(js, late)  # the gateway publishes it after the client gave up
    await wait_for(lambda: merger.counts["late_calls"] == 1, what="late call counted")
    await wait_for(lambda: merger_settled(js), what="everything acked")
    assert await stream_count(js, S.DLQ_STREAM) == 0 and await stream_count(js, S.SAMPLES_STREAM) == 0


async def test_a_successor_acks_what_its_predecessor_left_of_a_closed_episode(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    """A merger acks a closed episode's begin first. Should it die before the rest are acked (or a
    broker node lose those acks), the partition's next owner gets them without their begin: acked
    as leftovers, not dead-lettered as unknown. Bad input after the takeover is still dead-lettered."""
    await bus.ensure_streams(js)
    events = chain_episode("closed", turns=2, outcome="abort")
    for ev in events:
        await publish(js, ev)
    await wait_for(
        lambda: awaited_equals(stream_count(js, S.EPISODE_PARTS_STREAM), len(events)), what="partitioned"
    )
    [partition] = {m.subject.split(".")[2] for m in await read_stream(js, S.EPISODE_PARTS_STREAM)}
    p = int(partition)
    # the owner that died: its consumer took the episode, closed it and acked only the begin
    dead = await bus.durable_pull(js, S.EPISODE_PARTS_STREAM, f"merger-p{p}-dead", S.partition_filter(p))
    msgs = await dead.fetch(len(events), timeout=5)
    await next(m for m in msgs if m.subject.endswith(".begin")).ack_sync()
    merger = start_merger(**MERGER)
    await wait_for(lambda: merger_settled(js), what="the leftovers acked")
    assert merger.counts["replayed_leftovers"] == len(events) - 1
    assert await stream_count(js, S.DLQ_STREAM) == 0 and await stream_count(js, S.METRICS_STREAM) == 0
    await publish(js, llm([1], [2], episode_id="never-begun"))
    await wait_for(lambda: stream_count(js, S.DLQ_STREAM), what="the unknown episode dead-lettered")
    [letter] = await read_stream(js, S.DLQ_STREAM)
    assert letter.headers[bus.REASON_HEADER].startswith("unknown_episode:")


async def test_bad_input_goes_to_the_dead_letter_queue(js: JetStreamContext, merger: Merger) -> None:
    good = chain_episode("good", turns=2)
    await publish(js, good[0])
    bad: list[tuple[str, bytes]] = [
        (S.episode_subject("x1", "begin"), b"\xc1 not msgpack"),  # malformed
        (S.episode_subject("x2", "begin"), msgpack.packb({"v": 99, "kind": "begin"})),  # version
        (
            S.episode_subject("x3", "begin"),
            msgpack.packb({"v": 1, "kind": "begin", "episode_id": "x3"}),
        ),  # schema
        (S.episode_subject("x4", "begin"), msgpack.packb({"v": 1, "pad": b"\0" * (4 << 20)})),  # oversized
        (S.episode_subject("other", "begin"), encode(begin("x5"))),  # subject
        ("swarm.ep.x7.good.reward", encode(reward(9.0, episode_id="good", seq=3))),  # not_owner
        (S.episode_subject("x6", "llm"), encode(llm([1], [2], episode_id="x6"))),  # unknown_episode
        (S.episode_subject("good", "begin"), encode(begin("good", seq=5))),  # duplicate
    ]
    for subject, data in bad:
        await js.publish(subject, data)
    for ev in good[1:3]:  # llm seq 0 and 1 from the gateway
        await publish(js, ev)
    stale = good[1].model_copy(update={"call_id": "stale"})  # seq 0 again, under another msg id
    await js.publish(S.episode_subject("good", "llm"), encode(stale), headers={"Nats-Msg-Id": "stale"})
    for ev in good[3:]:
        await publish(js, ev)
    await publish(js, good[2].model_copy(update={"seq": 7}))  # after the end

    await wait_for(lambda: merger_settled(js), what="merger acked every event")
    dead = await read_stream(js, S.DLQ_STREAM)
    codes = [m.headers[bus.REASON_HEADER].split(":")[0] for m in dead]
    # Partitions are merged side by side: dead letters keep the stream's order within each episode,
    # and each names the EPISODES subject its agent published to.
    by_subject: dict[str, list[str]] = {}
    for m, code in zip(dead, codes, strict=True):
        by_subject.setdefault(m.headers[bus.SUBJECT_HEADER], []).append(code)
    good_ep = S.episode_filter("good", "*").removesuffix("*")
    assert by_subject.pop(good_ep + "begin") == ["duplicate"]
    assert by_subject.pop(good_ep + "llm") == ["out_of_order", "after_end"]
    assert by_subject == {subject: [code] for (subject, _), code in zip(
        bad[:7], ["malformed", "version", "schema", "oversized", "subject", "not_owner", "unknown_episode"],
        strict=True)}  # fmt: skip
    data = {m.headers[bus.SUBJECT_HEADER]: m.data for m in dead}
    assert [data[subject] for subject, _ in bad[:3]] == [d for _, d in bad[:3]]
    assert [s.sample_id for s in await samples(js)] == ["good.a.m.0"]
    assert merger.dlq is not None and sum(merger.dlq.counts.values()) == len(codes)


async def test_open_episode_is_kept_alive_past_the_ack_wait(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    merger = start_merger(ack_wait_s=1.0, episode_timeout_s=30.0)
    events = chain_episode("long", turns=2)
    for ev in events[:-1]:
        await publish(js, ev)
    # Three rounds of in-progress acks on 4 held events: the episode has outlived its ack wait.
    await wait_for(lambda: merger.counts["keepalive"] >= 12, what="in-progress acks")
    await publish(js, events[-1])
    await wait_for(lambda: merger_settled(js), what="merger acked every event")
    assert [s.n_calls for s in await samples(js)] == [2]
    assert merger.counts["redelivered"] == 0


async def test_stopped_merger_hands_open_episodes_to_its_successor(
    js: JetStreamContext, swarm_nats: NatsServer
) -> None:
    # A long ack wait: only the naks of a clean stop can bring the held events back within the test.
    cfg = MergerConfig(nats=swarm_nats.service_url, ack_wait_s=60.0, episode_timeout_s=60.0)
    events = chain_episode("handover", turns=2)
    first = Merger(cfg)
    task = asyncio.create_task(first.run())
    try:
        for ev in events[:-1]:
            await publish(js, ev)
        await wait_for(lambda: len(first.held) == 4, what="first merger holds the open episode")
    finally:
        first.request_stop()
        await asyncio.wait_for(task, timeout=10)

    second = Merger(cfg)
    task = asyncio.create_task(second.run())
    try:
        await publish(js, events[-1])
        await wait_for(lambda: merger_settled(js), timeout=15, what="successor merged the episode")
    finally:
        second.request_stop()
        await asyncio.wait_for(task, timeout=10)
    assert [(s.sample_id, s.n_calls) for s in await samples(js)] == [("handover.a.m.0", 2)]


async def test_heartbeats_keep_an_episode_alive(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    merger = start_merger(**MERGER | {"episode_timeout_s": 1.0})
    await publish(js, begin("quiet"))
    await publish(js, begin("beating"))

    def held(episode_id: str) -> int:
        ep = merger.episodes.get(episode_id)
        return len(ep.seqs) if ep else 0

    # The quiet episode is the clock: until it times out, the other one beats.
    seq = 0
    while merger.counts["timeout"] == 0:
        seq += 1
        await publish(js, HeartbeatEvent(episode_id="beating", seq=seq, client_id="agent-proc"))
        await wait_for(lambda n=seq + 1: held("beating") == n, what=f"heartbeat {seq}")
    await publish(js, EndEvent(episode_id="beating", seq=seq + 1, client_id="agent-proc"))
    await wait_for(lambda: merger_settled(js), what="merger acked every event")
    stats = {s.episode_id: s.status for s in await merge_stats(js)}
    assert stats == {"quiet": "timeout", "beating": "empty"}


async def test_events_that_come_before_their_begin_wait_for_it(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    """A delivery lost with a broker node comes back only after the ack wait, behind later events.
    An episode's events that come before its begin are parked until it comes, then merged with it;
    those whose begin never comes are dead-lettered as unknown after two ack waits."""
    merger = start_merger(**MERGER)
    events = chain_episode("late", turns=2)
    for ev in events[1:]:  # the begin last, as a redelivery brings it
        await publish(js, ev)
    await wait_for(lambda: merger.counts["parked"] == len(events) - 1, what="the begin-less events parked")
    await asyncio.sleep(1.5 * MERGER["ack_wait_s"])  # past an ack wait: parked events are kept alive
    assert await stream_count(js, S.DLQ_STREAM) == 0 and not await samples(js)
    await publish(js, events[0])
    await wait_for(lambda: merger_settled(js), what="the episode merged once its begin came")
    assert [s.sample_id for s in await samples(js)] == ["late.a.m.0"]
    assert merger.counts["unparked"] == len(events) - 1 and merger.counts["redelivered"] == 0
    assert await stream_count(js, S.DLQ_STREAM) == 0
    started = asyncio.get_running_loop().time()
    await publish(js, llm([1], [2], episode_id="never-begun"))
    await wait_for(lambda: stream_count(js, S.DLQ_STREAM), what="the unknown episode dead-lettered")
    assert asyncio.get_running_loop().time() - started > 1.5 * MERGER["ack_wait_s"]
    [letter] = await read_stream(js, S.DLQ_STREAM)
    assert letter.headers[bus.REASON_HEADER].startswith("unknown_episode:")
    await wait_for(lambda: merger_settled(js), what="the dead letter acked")
