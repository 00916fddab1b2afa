"""What the embedded engine hands back: a finished request's `GenerationOutput`, a streamed request's
`Step`s, and the `RequestStream` an async reader iterates over (`server.py` makes SGLang's JSON of them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class Step:
    """A streamed request's output so far, after a decode step that did not finish it."""

    rid: str
    output_ids: list[int]
    output_logprobs: list[float]
    prompt_tokens: int
    weight_version: str
    input_logprobs: list[float | None] = field(default_factory=list)
    """SGLang's `input_token_logprobs` for `prompt[logprob_start_len:]`, first None; empty if not asked."""
    input_logprob_ids: list[int] = field(default_factory=list)
    """The prompt tokens `input_logprobs` belong to."""
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (SGLang's `meta_info.cached_tokens`)."""


@dataclass(kw_only=True)
class GenerationOutput(Step):
    """One finished request. `finish_reason` is SGLang's dict: {"type": "stop"|"length"|"abort", ...}."""

    text: str
    finish_reason: dict[str, Any]


class RequestStream:
    """One streamed request: `async for item in stream` gives a `Step` after each decode step, then
    the final `GenerationOutput` (or raises what failed the forward). Steps are cumulative: a slow
    reader gets only the newest. `abort()`, or leaving the iteration, drops the request."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._latest: Step | None = None
        self._wake = asyncio.Event()
        self.future: cf.Future[GenerationOutput] = cf.Future()
        self.future.add_done_callback(lambda _: self._call(self._wake.set))

    def abort(self) -> None:
        self.future.cancel()  # no-op once finished

    def on_step(self, step: Step) -> None:
        """Scheduler thread: hand `step` to the reader's event loop."""
        self._call(self._deliver, step)

    def _deliver(self, step: Step) -> None:
        self._latest = step
        self._wake.set()

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the reader's loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(fn, *args)

    async def __aiter__(self) -> AsyncIterator[Step | GenerationOutput]:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self.future.done():  # its output holds every step since the last one read
                    yield self.future.result()
                    return
                if self._latest is not None:
                    step, self._latest = self._latest, None
                    yield step
        finally:
            self.abort()
