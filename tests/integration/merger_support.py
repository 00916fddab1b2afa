"""Helpers for the merger's integration tests: publish events like agents and the gateway, read streams."""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import (
    AbortEvent,
    EndEvent,
    Event,
    LostEpisode,
    MergeStats,
    Sample,
    decode,
    decode_sample,
    encode,
)
from swarmrl.schemas import subjects as S
from tests.unit.merger.factories import begin, chain, reward


async def publish(js: JetStreamContext, ev: Event, subject: str = "") -> None:
    subject = subject or S.episode_subject(ev.episode_id, ev.kind)
    await js.publish(subject, encode(ev), headers={"Nats-Msg-Id": ev.msg_id})


def chain_episode(episode_id: str, turns: int = 3, outcome: str = "end") -> list[Event]:
    """begin, `turns` chained llm calls (client gateway-test), a reward, then end or abort."""
    events: list[Event] = [begin(episode_id, client_id="agent-proc")]
    events += chain(turns, episode_id=episode_id)
    events.append(reward(1.0, episode_id=episode_id, seq=1))
    last: Event
    if outcome == "end":
        last = EndEvent(episode_id=episode_id, seq=2, client_id="agent-proc")
    else:
        last = AbortEvent(episode_id=episode_id, seq=2, client_id="agent-proc", reason="agent crashed")
    return [*events, last]


async def read_stream(js: JetStreamContext, stream: str) -> list[Any]:
    """Every message stored in `stream`, oldest first (raw: .subject, .data, .headers)."""
    state = (await js.stream_info(stream)).state
    if not state.messages:
        return []
    out = []
    for seq in range(state.first_seq, state.last_seq + 1):
        try:
            out.append(await js.get_msg(stream, seq))
        except NotFoundError:
            continue
    return out


async def samples(js: JetStreamContext) -> list[Sample]:
    msgs = await read_stream(js, S.SAMPLES_STREAM)
    return [decode_sample(m.data) for m in msgs if not m.subject.endswith(".lost")]


async def lost_episodes(js: JetStreamContext) -> list[LostEpisode]:
    msgs = await read_stream(js, S.SAMPLES_STREAM)
    return [decode(m.data, LostEpisode) for m in msgs if m.subject.endswith(".lost")]


async def merge_stats(js: JetStreamContext) -> list[MergeStats]:
    msgs = await read_stream(js, S.METRICS_STREAM)
    return [decode(m.data, MergeStats) for m in msgs if m.subject == S.MERGE_METRICS_SUBJECT]


async def stream_count(js: JetStreamContext, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


async def merger_settled(js: JetStreamContext) -> bool:
    """Have the mergers taken and acked everything in EPISODES? Every message has reached the work
    queue EPISODE_PARTS (sourced from EPISODES from its start), and the work queue is empty."""
    episodes = (await js.stream_info(S.EPISODES_STREAM)).state
    parts = (await js.stream_info(S.EPISODE_PARTS_STREAM)).state
    return parts.last_seq == episodes.last_seq and parts.messages == 0


async def awaited_equals(value: object, want: object) -> bool:
    """Does the awaitable `value` come to `want`? (for `wait_for` on an async query)"""
    return bool(await value == want)  # type: ignore[misc]
