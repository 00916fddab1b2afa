"""What a merger partition holds between delivery and ack: open episodes (`OpenEpisode`), the
messages owed an ack (`Held`, `Parked`), lately acked sequences (`RecentAcks`: a lost ack comes
back as a redelivery, to be acked again), and `Inflight`, the only code that acks, naks or keeps
them alive."""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import nats.errors
from nats.aio.msg import Msg

from swarmrl.schemas import BeginEvent, RewardEvent

log = logging.getLogger("swarmrl.merger")
K = TypeVar("K", bound=Hashable)


@dataclass
class OpenEpisode:
    begin: BeginEvent
    call_seqs: list[int] = field(default_factory=list)
    """Stream sequences of the LLM calls, in stream order (sample ids depend on it). The calls stay
    msgpack in the held messages until the episode closes: decoded, they take far more memory."""
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
    """An event of an episode whose begin has not come (yet): `Inflight.park`."""

    reason: str
    """What it is dead-lettered with should its begin never come (`unknown_episode: ...`)."""


class RecentAcks(Generic[K]):
    """Keys (stream sequences acked, episodes closed) seen within the last `keep_s` seconds."""

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


class Inflight:
    """Every unacked event of one partition, by stream sequence: `held` (of open episodes) and
    `parked` (begin not come yet). On a stop all are nak'ed for the partition's next owner."""

    def __init__(self, ack_wait_s: float, counts: Counter[str]) -> None:
        self.ack_wait_s = ack_wait_s
        self.counts = counts
        self.held: dict[int, Held] = {}
        self.parked: dict[int, Parked] = {}
        self.park_until: dict[str, float] = {}
        """Episode id -> when its parked events are dead-lettered if its begin has not come."""
        self.acked: RecentAcks[int] = RecentAcks(keep_s=2 * ack_wait_s)
        self.kept_alive = time.monotonic()

    def refresh(self, seq: int, msg: Msg) -> bool:
        """A redelivery of an event we hold (its ack wait ran out): keep the newest. False: not held."""
        held = self.held.get(seq) or self.parked.get(seq)
        if held is None:
            return False
        held.msg, held.touched = msg, time.monotonic()
        self.counts["redelivered"] += 1
        return True

    def hold(self, seq: int, msg: Msg, episode_id: str) -> None:
        self.held[seq] = Held(msg, time.monotonic(), episode_id)

    def park(self, seq: int, msg: Msg, episode_id: str, reason: str) -> None:
        """Hold an event whose begin has not come, for two ack waits; then dead-letter it with `reason`."""
        self.park_until.setdefault(episode_id, time.monotonic() + 2 * self.ack_wait_s)
        self.parked[seq] = Parked(msg, time.monotonic(), episode_id, reason)
        self.counts["parked"] += 1

    def unpark(self, episode_id: str) -> list[tuple[int, Parked]]:
        """Take episode `episode_id`'s parked events out, in stream order."""
        del self.park_until[episode_id]
        mine = sorted(seq for seq, parked in self.parked.items() if parked.episode_id == episode_id)
        return [(seq, self.parked.pop(seq)) for seq in mine]

    def expired(self, now: float) -> list[Parked]:
        """The parked events whose begin did not come in time, taken out."""
        due = [eid for eid, until in self.park_until.items() if now >= until]
        return [parked for eid in due for _, parked in self.unpark(eid)]

    async def ack(self, msg: Msg, seq: int) -> None:
        if not msg.is_acked:
            await msg.ack()
        self.acked.add(seq, time.monotonic())

    async def ack_held(self, seqs: Iterable[int]) -> None:
        """Ack the held events `seqs` (an episode's, begin first) and let them go."""
        for seq in seqs:
            if (held := self.held.pop(seq, None)) is not None:
                await self.ack(held.msg, seq)

    async def keep_alive(self, now: float) -> bool:
        """Every quarter ack wait, an in-progress ack for each event untouched for half of it (True:
        this was such a round)."""
        if now - self.kept_alive <= self.ack_wait_s / 4:
            return False
        self.kept_alive = now
        for held in [*self.held.values(), *self.parked.values()]:
            if now - held.touched > self.ack_wait_s / 2:
                await held.msg.in_progress()
                held.touched = now
                self.counts["keepalive"] += 1
        return True

    async def nak_all(self) -> None:
        msgs = [h.msg for h in (*self.held.values(), *self.parked.values())]
        try:
            for msg in msgs:
                await msg.nak()
        except nats.errors.Error as exc:  # connection gone: the ack wait returns them instead
            log.warning("could not hand back %d messages: %s", len(msgs), exc)
