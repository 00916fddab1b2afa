"""What the merger holds between delivery and ack (bookkeeping only; the handlers do the NATS calls).

- `OpenEpisode`: the events of an episode that has begun and not yet ended, aborted or timed out.
- `Held`: a delivered message we owe an ack, with the last time we told the server it is in work.
- `RecentAcks`: stream sequences we acked lately. JetStream acks are fire-and-forget; one lost on a
  connection blip comes back as a redelivery, which must be acked again, not dead-lettered as an
  event of a closed episode (nor, for a message we never saw, acked without a trace).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from nats.aio.msg import Msg

from swarmrl.schemas import BeginEvent, RewardEvent

K = TypeVar("K", bound=Hashable)


@dataclass
class OpenEpisode:
    begin: BeginEvent
    call_seqs: list[int] = field(default_factory=list)
    """Stream sequences of the LLM calls, in stream order (sample ids depend on it, so a replay yields
    the same ids). The calls themselves stay msgpack in the held messages until the episode closes:
    decoded, their token lists take about six times the memory."""
    rewards: list[RewardEvent] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    """Stream sequences of the held events, begin first."""


@dataclass
class Held:
    msg: Msg
    """The newest delivery of the message: acking it acks the stream sequence."""
    touched: float
    """Monotonic time of the delivery or of the last in-progress ack."""
    episode_id: str


@dataclass
class Parked(Held):
    """An event of an episode whose begin has not come (yet): the merger's `_park`."""

    reason: str
    """What it is dead-lettered with should its begin never come (`unknown_episode: ...`)."""


class RecentAcks(Generic[K]):
    """Keys (stream sequences acked, episodes closed) seen within the last `keep_s` seconds (a lost ack
    returns within the ack wait)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._order: deque[tuple[float, K]] = deque()
        self._seqs: set[K] = set()

    def add(self, seq: K, now: float) -> None:
        self._order.append((now, seq))
        self._seqs.add(seq)
        while self._order and now - self._order[0][0] > self.keep_s:
            self._seqs.discard(self._order.popleft()[1])

    def __contains__(self, seq: object) -> bool:
        return seq in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)
