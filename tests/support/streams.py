"""Reading JetStream streams whole, as the chaos benchmark's accounting and the tests do: every
message a stream holds through an ephemeral consumer that acks nothing (`read_stream`), and the
episodes whose events still wait in EPISODE_PARTS (`queued_events`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from swarmrl.schemas import subjects as S
from swarmrl.services.common.retry import backoff


@dataclass
class Msg:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


async def read_stream(js: JetStreamContext, stream: str, batch: int = 1000) -> list[Msg]:
    """Every message `stream` holds, in order, through an ephemeral consumer that acks nothing."""
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    cfg = ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=120.0
    )
    sub = await js.pull_subscribe(S.STREAM_SUBJECTS[stream][0], stream=stream, config=cfg)
    out: list[Msg] = []
    timeouts = 0
    try:
        while not out or out[-1].seq < info.state.last_seq:
            try:
                msgs = await _fetch(sub, batch)
            except nats.errors.TimeoutError:
                # A short read would show as lost messages: try again, then fail loudly. (The stream's
                # last message can be gone only from a work queue, which is never read here.)
                timeouts += 1
                if timeouts > READ_TIMEOUTS:
                    got = out[-1].seq if out else 0
                    raise RuntimeError(
                        f"{stream}: read stopped at seq {got} of {info.state.last_seq}"
                    ) from None
                continue
            out += [Msg(m.metadata.sequence.stream, m.subject, m.data, dict(m.headers or {})) for m in msgs]
    finally:
        await sub.unsubscribe()
    return out


READ_TIMEOUTS = 3
"""Fetches of 5 s that may come back empty in a row before `read_stream` gives up."""


async def queued_events(js: JetStreamContext) -> dict[str, tuple[int, int]]:
    """Episode id -> (partition, events) still in EPISODE_PARTS: events no merger acked (a work queue
    deletes an event once its episode is closed), from the stream's per-subject counts."""
    try:
        info = await js.stream_info(S.EPISODE_PARTS_STREAM, subjects_filter=">")
    except NotFoundError:
        return {}
    out: dict[str, tuple[int, int]] = {}
    for subject, n in (info.state.subjects or {}).items():  # swarm.epp.<p>.<owner>.<episode id>.<kind>
        try:
            eid, _ = S.parse_episode_subject(S.unpartitioned(subject))
        except ValueError:  # not an episode event: nothing a merger would close
            continue
        p, count = out.get(eid, (int(subject.split(".")[2]), 0))
        out[eid] = (p, count + n)
    return out


async def _fetch(sub: Any, batch: int) -> list[Any]:
    """One fetch; a 503 (the new consumer has no leader yet, as after a node came back) is retried
    for up to 30 s: the consumer keeps its position, so nothing is read twice."""
    fetch = functools.partial(sub.fetch, batch, timeout=5.0)
    unavailable = (nats.js.errors.ServiceUnavailableError,)
    return list(await backoff(fetch, transient=unavailable, seconds=30.0, first_s=0.5, max_s=0.5))
