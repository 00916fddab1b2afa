"""A model's engines as one pool: calls spread by load, an episode's calls kept on one engine, a dead
engine left out and its calls retried on another.

An episode's *home* is the engine up with the highest hash of (episode id, URL) (rendezvous hashing:
every gateway finds the same home), whose prefix cache holds its earlier calls, unless the home has
`slack` more calls in flight here than the least loaded engine. An engine that cannot be reached is
*down* for `down_s` and the call goes to the next (a stream only before its first event); when all
are down the call waits up to `retry_s` for one to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from typing import Any

import httpx

from swarmrl.services.engine.client import EngineError, GenerateResult

log = logging.getLogger("swarmrl.gateway")


def _score(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest(), "big")


def choose(key: str, loads: dict[str, int], slack: int) -> str:
    """The engine (of `loads`: URL -> calls in flight, the engines up) for a call of episode `key`."""
    home = max(loads, key=lambda url: _score(key, url))
    least = min(loads, key=lambda url: (loads[url], -_score(key, url)))
    return home if loads[home] <= loads[least] + slack else least


def _unreachable(exc: BaseException) -> bool:
    """A failure that says the engine is gone (not that it refused or timed out on this request)."""
    if isinstance(exc, EngineError):
        return exc.status == 0
    return isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.TimeoutException)


class EnginePool:
    """Engines of one model (see the module docstring); `members` are `EngineClient`s (or vLLM's)."""

    def __init__(
        self, members: Sequence[Any], *, slack: int = 4, down_s: float = 5.0, retry_s: float = 60.0
    ) -> None:
        if not members:
            raise ValueError("an engine pool needs at least one engine")
        self.members = {m.base_url: m for m in members}
        self.slack, self.down_s, self.retry_s = slack, down_s, retry_s
        self.loads = dict.fromkeys(self.members, 0)
        self.down_until = dict.fromkeys(self.members, 0.0)
        self.failovers = 0  # calls moved to another engine after theirs could not be reached

    @property
    def first(self) -> Any:
        """An engine of the pool that is up (the first listed if none is)."""
        now = time.monotonic()
        up = [m for url, m in self.members.items() if self.down_until[url] <= now]
        return (up or list(self.members.values()))[0]

    def pick(self, key: str, now: float, avoid: Collection[str] = ()) -> str | None:
        up = {u: n for u, n in self.loads.items() if self.down_until[u] <= now and u not in avoid}
        return choose(key, up, self.slack) if up else None

    def mark_down(self, url: str, exc: BaseException) -> None:
        if self.down_until[url] <= time.monotonic():
            log.warning("engine %s left the pool for %.0f s: %r", url, self.down_s, exc)
        self.down_until[url] = time.monotonic() + self.down_s

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, key: str = ""
    ) -> GenerateResult:
        async def once(engine: Any) -> AsyncGenerator[GenerateResult, None]:
            yield await engine.generate(prompt_ids, sampling, return_logprob=True)

        async with contextlib.aclosing(self._failover(key, once)) as results:
            return await anext(results)

    def generate_stream(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, key: str = ""
    ) -> AsyncGenerator[Any, None]:
        return self._failover(
            key, lambda engine: engine.generate_stream(prompt_ids, sampling, return_logprob=True)
        )

    async def _failover(
        self, key: str, call: Callable[[Any], AsyncGenerator[Any, None]]
    ) -> AsyncGenerator[Any, None]:
        """What `call(engine)` yields, from the engine of `key`, or the next if it cannot be reached
        before its first item."""
        deadline, tried = time.monotonic() + self.retry_s, set[str]()
        while True:
            now = time.monotonic()
            url = self.pick(key, now, tried) or self.pick(key, now)  # an untried engine, else any up
            if url is None:
                if now >= deadline:
                    raise EngineError(
                        0, f"no engine of the pool reachable for {self.retry_s:g} s: {list(self.members)}"
                    )
                await asyncio.sleep(min(0.5, max(0.0, min(self.down_until.values()) - now)))
                continue
            started = False
            self.loads[url] += 1
            try:
                # closed at once when the caller stops: the engine aborts the call
                async with contextlib.aclosing(call(self.members[url])) as items:
                    async for item in items:
                        started = True
                        yield item
                return
            except (EngineError, httpx.HTTPError) as exc:
                if started or not _unreachable(exc):
                    raise
                self.mark_down(url, exc)  # out of the pool for a while, and not tried again by this call
                tried.add(url)
                self.failovers += 1
            finally:
                self.loads[url] -= 1

    async def aclose(self) -> None:
        for member in self.members.values():
            await member.aclose()
