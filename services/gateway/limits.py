"""Per-agent fairness: each agent identity's LLM call rate and concurrent episodes, bounded.

An identity is the owner part of its episode ids. Per identity: **calls**, a token bucket of `rate`
calls per second with room for `burst` (past it: 429 with `Retry-After`), which also takes the calls
other gateways served; **episodes**, at most `max_episodes` open at once (past it the token request
is told to retry), each holding a slot in NATS KV until its `end` or `abort`, or `idle_s` without a
call. Pure and clock-driven (`now` is passed in); 0 turns a bound off. The NATS side: `episodes.py`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class OpenEpisode:
    """An open episode as the gateways see it: the slot it holds and its KV key's revision."""

    identity: str
    episode_id: str
    slot: int
    revision: int
    written: float  # when its key was last written (by any gateway), on this gateway's clock
    seen: float = float("-inf")  # its last call served by this gateway

    @property
    def last(self) -> float:
        return max(self.written, self.seen)


@dataclass
class AgentLimits:
    rate: float = 0.0  # LLM calls per second per agent identity (0: no bound)
    burst: int = 0  # calls an identity may make at once before the rate applies (0: max(1, rate))
    max_episodes: int = 0  # episodes an identity may have open at once (0: no bound)
    idle_s: float = 600.0  # an open episode with no call for this long is taken as abandoned and closed
    retry_after_s: float = 1.0
    """What a token request past `max_episodes` is told to wait before it asks again."""
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _served: Counter[str] = field(default_factory=Counter)  # identity -> calls since `take_served`
    _open: dict[str, dict[str, OpenEpisode]] = field(default_factory=dict)  # identity -> episode -> it
    refused_calls: int = 0
    refused_episodes: int = 0

    @property
    def capacity(self) -> float:
        return float(self.burst) if self.burst > 0 else max(1.0, self.rate)

    def _bucket(self, identity: str, now: float) -> _Bucket:
        """`identity`'s bucket, refilled up to `now`."""
        b = self._buckets.setdefault(identity, _Bucket(self.capacity, now))
        b.tokens = min(self.capacity, b.tokens + (now - b.at) * self.rate)
        b.at = now
        return b

    def call(self, identity: str, now: float) -> float:
        """0.0 to serve the call now (one call taken from the bucket), else seconds until one may."""
        if self.rate <= 0:
            return 0.0
        b = self._bucket(identity, now)
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            self._served[identity] += 1
            return 0.0
        self.refused_calls += 1
        return (1.0 - b.tokens) / self.rate

    def spent(self, identity: str, calls: int, now: float) -> None:
        """`calls` of `identity` that another gateway served: taken from this bucket too, which may go
        into debt (down to -capacity)."""
        if self.rate > 0:
            b = self._bucket(identity, now)
            b.tokens = max(-self.capacity, b.tokens - calls)

    def take_served(self) -> dict[str, int]:
        """The calls served here since the last time, per identity (for the other gateways)."""
        served, self._served = dict(self._served), Counter()
        return served

    def free_slots(self, identity: str, episode_id: str, now: float) -> list[int] | None:
        """None if `episode_id` needs no new slot (no bound, or it holds one); else the slots no live
        episode of `identity` holds, lowest first (empty: it must wait, and the refusal is counted)."""
        if self.max_episodes <= 0:
            return None
        episodes = self._open.get(identity, {})
        if episode_id in episodes:
            return None
        held = {e.slot for e in episodes.values() if now - e.last <= self.idle_s}
        free = [slot for slot in range(self.max_episodes) if slot not in held]
        if not free:
            self.refused_episodes += 1
        return free

    def holder(self, identity: str, slot: int) -> OpenEpisode | None:
        return next((e for e in self._open.get(identity, {}).values() if e.slot == slot), None)

    def find(self, identity: str, episode_id: str) -> OpenEpisode | None:
        return self._open.get(identity, {}).get(episode_id)

    def opened(self, episode: OpenEpisode) -> None:
        """Its key was written (a new episode in the slot, or a refresh)."""
        old = self.holder(episode.identity, episode.slot)
        if old is not None and old.episode_id != episode.episode_id:
            self.closed(episode.identity, old.episode_id)
        known = self.find(episode.identity, episode.episode_id)
        if known is not None and known.slot == episode.slot:
            episode.seen = max(episode.seen, known.seen)
        self._open.setdefault(episode.identity, {})[episode.episode_id] = episode

    def closed(self, identity: str, episode_id: str) -> None:
        episodes = self._open.get(identity)
        if episodes is not None:
            episodes.pop(episode_id, None)
            if not episodes:
                del self._open[identity]

    def seen(self, identity: str, episode_id: str, now: float) -> None:
        """A call of `episode_id` came here: it is alive."""
        episode = self.find(identity, episode_id)
        if episode is not None:
            episode.seen = now

    def idle(self, now: float) -> list[OpenEpisode]:
        """Open episodes without a call or a write for `idle_s`: their slots are to be freed."""
        return [e for e in self._episodes() if now - e.last > self.idle_s]

    def _episodes(self) -> list[OpenEpisode]:
        return [e for eps in self._open.values() for e in eps.values()]

    def due(self, now: float, every_s: float) -> list[OpenEpisode]:
        """Episodes called here since their key was written, not written for `every_s`: to write again."""
        return [e for e in self._episodes() if e.seen > e.written and now - e.written >= every_s]

    def open_count(self, identity: str) -> int:
        return len(self._open.get(identity, ()))
