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
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import contextmanager
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

    @contextmanager
    def _busy(self, url: str) -> Any:
        self.loads[url] += 1
        try:
            yield self.members[url]
        finally:
            self.loads[url] -= 1

    def _failed_over(self, url: str, exc: BaseException, tried: set[str]) -> None:
        """`url` could not be reached: out of the pool for a while, and not tried again by this call."""
        self.mark_down(url, exc)
        tried.add(url)
        self.failovers += 1

    async def _next(self, key: str, tried: set[str], deadline: float) -> str:
        """An untried engine that is up, else any that is up, else the first back before `deadline`."""
        while True:
            now = time.monotonic()
            url = self.pick(key, now, tried) or self.pick(key, now)
            if url is not None:
                return url
            if now >= deadline:
                raise EngineError(
                    0, f"no engine of the pool reachable for {self.retry_s:g} s: {list(self.members)}"
                )
            await asyncio.sleep(min(0.5, max(0.0, min(self.down_until.values()) - now)))

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, key: str = ""
    ) -> GenerateResult:
        deadline, tried = time.monotonic() + self.retry_s, set[str]()
        while True:
            url = await self._next(key, tried, deadline)
            try:
                with self._busy(url) as engine:
                    result: GenerateResult = await engine.generate(prompt_ids, sampling, return_logprob=True)
                    return result
            except (EngineError, httpx.HTTPError) as exc:
                if not _unreachable(exc):
                    raise
                self._failed_over(url, exc, tried)

    async def generate_stream(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, key: str = ""
    ) -> AsyncIterator[Any]:
        deadline, tried = time.monotonic() + self.retry_s, set[str]()
        while True:
            url = await self._next(key, tried, deadline)
            started = False
            try:
                with self._busy(url) as engine:
                    stream = engine.generate_stream(prompt_ids, sampling, return_logprob=True)
                    async with contextlib.aclosing(stream):  # closed at once: the engine aborts the call
                        async for item in stream:
                            started = True
                            yield item
                return
            except (EngineError, httpx.HTTPError) as exc:
                if started or not _unreachable(exc):
                    raise
                self._failed_over(url, exc, tried)

    async def aclose(self) -> None:
        for member in self.members.values():
            await member.aclose()
