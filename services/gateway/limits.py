"""Per-agent fairness: each agent identity's LLM call rate and concurrent episodes, bounded.

An agent identity is the NATS identity a client connects with (`swarmrl credentials mint NAME`):
the owner part of its episode ids, which the gateway checks when it mints the episode's tokens. One
busy or broken client must not take the engines from every other one, so the gateway bounds, per
identity:

- **calls**: a token bucket of `rate` LLM calls per second with room for `burst` at once; a call
  past it is refused with 429 `rate_limit_exceeded` and a `Retry-After` (the OpenAI SDKs wait that
  long and retry by themselves). Each gateway keeps the buckets, and takes from them the calls
  every other gateway served too, as the gateways tell each other (`calls.py`): the rate holds
  across gateways;
- **episodes**: at most `max_episodes` open at once, across every gateway; a token request for one
  more is answered with `retry_after_s` (the SDK waits and asks again, as for admission control).
  An episode is open from its first token until its `end` or `abort` event, or until no call of it
  came for `idle_s` (a client that died without ending it). Each open episode holds one of its
  identity's `max_episodes` slots, a key in NATS KV that every gateway sees (`episodes.py`); this
  class holds the view of them, `OpenEpisode`s, as the gateways wrote them.

Pure and clock-driven (`now` is passed in): no NATS here; `service.py`, `calls.py` and `episodes.py`
feed it. 0 turns a bound off.
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
    written: float
    """When its key was last written (by any gateway), on this gateway's clock."""
    seen: float = float("-inf")
    """Its last call served by this gateway."""

    @property
    def last(self) -> float:
        return max(self.written, self.seen)


@dataclass
class AgentLimits:
    rate: float = 0.0
    """LLM calls per second per agent identity (0: no bound)."""
    burst: int = 0
    """Calls an identity may make at once before the rate applies (0: max(1, rate))."""
    max_episodes: int = 0
    """Episodes an identity may have open at once (0: no bound)."""
    idle_s: float = 600.0
    """An open episode with no call for this long is taken as abandoned and closed."""
    retry_after_s: float = 1.0
    """What a token request past `max_episodes` is told to wait before it asks again."""
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _served: Counter[str] = field(default_factory=Counter)
    """identity -> calls served here since `take_served` last took them."""
    _open: dict[str, dict[str, OpenEpisode]] = field(default_factory=dict)
    """identity -> episode -> its slot."""
    refused_calls: int = 0
    refused_episodes: int = 0

    @property
    def capacity(self) -> float:
        return float(self.burst) if self.burst > 0 else max(1.0, self.rate)

    def _bucket(self, identity: str, now: float) -> _Bucket:
        """`identity`'s bucket, refilled up to `now`."""
        b = self._buckets.get(identity)
        if b is None:
            b = self._buckets[identity] = _Bucket(self.capacity, now)
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
        """`calls` of `identity` that another gateway served: taken from this bucket too. It may go
        into debt (down to -capacity: what gateways that could not yet see each other served at once),
        which this gateway's refusals then pay back."""
        if self.rate > 0:
            b = self._bucket(identity, now)
            b.tokens = max(-self.capacity, b.tokens - calls)

    def take_served(self) -> dict[str, int]:
        """The calls served here since the last time, per identity (for the other gateways)."""
        served, self._served = dict(self._served), Counter()
        return served

    def free_slots(self, identity: str, episode_id: str, now: float) -> list[int] | None:
        """None if `episode_id` may go on without a new slot (no bound, or it holds one already);
        else the slots no live episode of `identity` holds, lowest first (empty: it must wait, and
        the refusal is counted). Records nothing: a slot is the gateway's once its KV create won."""
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
        return [e for eps in self._open.values() for e in eps.values() if now - e.last > self.idle_s]

    def due(self, now: float, every_s: float) -> list[OpenEpisode]:
        """Episodes called here since their key was last written, and not written for `every_s`:
        their keys are to be written again, so that no gateway takes them as idle."""
        return [
            e
            for eps in self._open.values()
            for e in eps.values()
            if e.seen > e.written and now - e.written >= every_s
        ]

    def open_count(self, identity: str) -> int:
        return len(self._open.get(identity, ()))
