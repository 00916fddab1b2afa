"""Per-agent fairness: each agent identity's LLM call rate and concurrent episodes, bounded.

An agent identity is the NATS identity a client connects with (`swarmrl credentials mint NAME`):
the owner part of its episode ids, which the gateway checks when it mints the episode's tokens. One
busy or broken client must not take the engines from every other one, so the gateway bounds, per
identity:

- **calls**: a token bucket of `rate` LLM calls per second with room for `burst` at once; a call
  past it is refused with 429 `rate_limit_exceeded` and a `Retry-After` (the OpenAI SDKs wait that
  long and retry by themselves);
- **episodes**: at most `max_episodes` open at once; a token request for one more is answered with
  `retry_after_s` (the SDK waits and asks again, as for admission control). An episode is open from
  its first token until its `end` or `abort` event, or until no call of it came for `idle_s` (a
  client that died without ending it).

Pure and clock-driven (`now` is passed in): no NATS here; `service.py` feeds it. 0 turns a bound off.
The state is this gateway's own: with several gateways each bounds what it serves.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: float
    at: float


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
    _open: dict[str, OrderedDict[str, float]] = field(default_factory=dict)
    """identity -> episode -> last seen, least recently seen first."""
    refused_calls: int = 0
    refused_episodes: int = 0

    @property
    def capacity(self) -> float:
        return float(self.burst) if self.burst > 0 else max(1.0, self.rate)

    def call(self, identity: str, now: float) -> float:
        """0.0 to serve the call now (one call taken from the bucket), else seconds until one may."""
        if self.rate <= 0:
            return 0.0
        b = self._buckets.get(identity)
        if b is None:
            b = self._buckets[identity] = _Bucket(self.capacity, now)
        b.tokens = min(self.capacity, b.tokens + (now - b.at) * self.rate)
        b.at = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0.0
        self.refused_calls += 1
        return (1.0 - b.tokens) / self.rate

    def check_episode(self, identity: str, episode_id: str, now: float) -> float:
        """0.0 if `episode_id` may open (or go on: it is open already), else seconds to wait; records
        nothing (`open_episode` does, once the token is granted)."""
        if self.max_episodes <= 0:
            return 0.0
        episodes = self._open.get(identity)
        if episodes is None:
            return 0.0
        self._expire(episodes, now)
        if episode_id in episodes or len(episodes) < self.max_episodes:
            return 0.0
        self.refused_episodes += 1
        return self.retry_after_s

    def open_episode(self, identity: str, episode_id: str, now: float) -> None:
        if self.max_episodes > 0:
            episodes = self._open.setdefault(identity, OrderedDict())
            episodes[episode_id] = now
            episodes.move_to_end(episode_id)

    def seen(self, identity: str, episode_id: str, now: float) -> None:
        """A call of `episode_id` came: it is alive."""
        episodes = self._open.get(identity)
        if episodes is not None and episode_id in episodes:
            episodes[episode_id] = now
            episodes.move_to_end(episode_id)

    def close_episode(self, identity: str, episode_id: str) -> None:
        episodes = self._open.get(identity)
        if episodes is not None:
            episodes.pop(episode_id, None)
            if not episodes:
                del self._open[identity]

    def open_count(self, identity: str) -> int:
        return len(self._open.get(identity, ()))

    def _expire(self, episodes: OrderedDict[str, float], now: float) -> None:
        while episodes and now - next(iter(episodes.values())) > self.idle_s:
            episodes.popitem(last=False)
