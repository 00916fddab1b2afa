"""Episode event ordering rules, shared by every consumer of EPISODES (pure logic, no NATS).

An episode starts with `begin`; every later event of it must come from a known episode that has not
ended; `seq` is strictly increasing per (episode_id, client_id). Whatever breaks a rule is returned
as a dead-letter reason (`<code>: <detail>`), never raised and never dropped. The one tolerated
exception is `late_call`: a gateway `llm` event racing the client's `abort`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from swarmrl.schemas import Event, WireError
from swarmrl.schemas import subjects as S

DEAD_LETTER_CODES = (
    "malformed", "version", "schema", "oversized", "subject", "not_owner", "unknown_episode", "duplicate",
    "out_of_order", "after_end", "poison", "unknown_kind", "group_size", "demand",
)  # fmt: skip


def episode_of(subject: str) -> tuple[str, str]:
    """(episode_id, kind) of an episode subject, else WireError: `not_owner` when the subject's client
    does not own the episode (it wrote into someone else's), `subject` when it is no episode subject."""
    try:
        return S.parse_episode_subject(subject)
    except S.NotOwnerError as exc:
        raise WireError("not_owner", str(exc)) from exc
    except ValueError as exc:
        raise WireError("subject", str(exc)) from exc


def check_subject(subject: str, ev: Event) -> None:
    """Raise WireError unless `ev` belongs on `subject` (see `episode_of`)."""
    if episode_of(subject) != (ev.episode_id, ev.kind):
        raise WireError(
            "subject", f"payload is {ev.kind} of episode {ev.episode_id} but subject is {subject}"
        )


@dataclass(slots=True)
class EpisodeState:
    begin_ts: float
    last_event_ts: float
    last_seq: dict[str, int] = field(default_factory=dict)


class EpisodeTracker:
    """Tracks open episodes and recently closed ones; `check` accepts an event or names the broken rule."""

    def __init__(self, max_closed: int = 200_000) -> None:
        self.open: dict[str, EpisodeState] = {}
        self.closed: OrderedDict[str, str] = OrderedDict()  # episode_id -> "end" | "abort" | "timeout"
        self.max_closed = max_closed

    def check(self, ev: Event, received: float | None = None) -> str | None:
        """Apply `ev` to the state; return None if accepted, else a dead-letter reason. `received`: the
        local receive time, used for timeouts (client clocks may be skewed)."""
        eid = ev.episode_id
        now = ev.ts if received is None else received
        if ev.kind == "begin":
            if eid in self.open or eid in self.closed:
                return f"duplicate: episode {eid} already begun"
            self.open[eid] = EpisodeState(begin_ts=now, last_event_ts=now, last_seq={ev.client_id: ev.seq})
            return None
        if eid in self.closed:
            return f"after_end: {ev.kind} for episode {eid}, which already closed ({self.closed[eid]})"
        state = self.open.get(eid)
        if state is None:
            return f"unknown_episode: {ev.kind} for episode {eid} with no begin"
        last = state.last_seq.get(ev.client_id)
        if last is not None and ev.seq == last:
            return f"duplicate: seq {ev.seq} from {ev.client_id} already seen in episode {eid}"
        if last is not None and ev.seq < last:
            return f"out_of_order: seq {ev.seq} from {ev.client_id} after seq {last} in episode {eid}"
        state.last_seq[ev.client_id] = ev.seq
        if now > state.last_event_ts:
            state.last_event_ts = now
        if ev.kind in ("end", "abort"):
            self.close(eid, ev.kind)
        return None

    def late_call(self, ev: Event) -> bool:
        """An `llm` event of an episode that was aborted or timed out: the gateway finished a call
        that was in flight when the client gave up. A race, not bad input (so not a dead letter):
        the ledger records the call, the merger drops it with its episode. After `end` it is bad
        input: the gateway publishes a call's event before the client sees the reply."""
        return ev.kind == "llm" and self.closed.get(ev.episode_id) in ("abort", "timeout")

    def close(self, episode_id: str, how: str) -> None:
        self.open.pop(episode_id, None)
        self.closed[episode_id] = how
        while len(self.closed) > self.max_closed:
            self.closed.popitem(last=False)

    def expire(self, now: float, timeout_s: float) -> list[str]:
        """Close, as `timeout`, the open episodes with no event for `timeout_s` seconds (by receive
        time); returns their ids. A later event of one of them is `after_end`."""
        stale = [eid for eid, st in self.open.items() if now - st.last_event_ts > timeout_s]
        for eid in stale:
            self.close(eid, "timeout")
        return stale
