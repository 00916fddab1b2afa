"""A dataset task's reward function, called TRL's way: a whole group's completions in one call.

`reward(prompts=[...], completions=[...], **{column: [...]})` returns one float per completion (sync
or async). Inside `group(size)` each episode's score waits until every episode of the group has its
reply (or has failed, `leave`); outside one an episode is scored alone. A raise, or a list of the
wrong length, fails every episode of the call; a value that is not a finite number fails its own
episode only (a `RewardError` naming the function, the rows and what came back).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

SHAPE = "need a list with one float per completion"


class RewardError(RuntimeError):
    """The reward function failed or answered something other than one finite number per completion."""


@dataclass
class Entry:
    columns: Mapping[str, Any]
    task_id: str
    completion: Any
    result: asyncio.Future[float] | None = None  # None: the start-up probe's


@dataclass
class RewardBatch:
    """The episodes of one group that still owe a reply (`size` of them at first)."""

    size: int
    entries: list[Entry] = field(default_factory=list)
    left: int = 0
    call: Callable[[list[Entry]], Any] | None = None

    async def score(self, entry: Entry, call: Callable[[list[Entry]], Any]) -> float:
        self.entries.append(entry)
        self.call = call
        _SLOT.get({})["scored"] = True
        await self._maybe_fire()
        assert entry.result is not None, "a scored entry carries its future"
        return await entry.result

    async def leave(self) -> None:
        """An episode of the group failed before its reply: stop waiting for it."""
        self.left += 1
        await self._maybe_fire()

    async def _maybe_fire(self) -> None:
        if self.entries and len(self.entries) + self.left >= self.size and self.call is not None:
            entries, self.entries = self.entries, []
            await self.call(entries)


_GROUP: contextvars.ContextVar[RewardBatch | None] = contextvars.ContextVar("reward_group", default=None)
_SLOT: contextvars.ContextVar[dict[str, bool]] = contextvars.ContextVar("reward_slot")


@contextlib.contextmanager
def group(size: int) -> Iterator[RewardBatch]:
    """Episodes started (as tasks) inside this block share one reward call; wrap each in `member()`."""
    batch = RewardBatch(size)
    token = _GROUP.set(batch)
    try:
        yield batch
    finally:
        _GROUP.reset(token)


async def member(play: Awaitable[T]) -> T:
    """`play`, one episode of the current `group`: ending without asking for its reward, it `leave`s."""
    batch, slot = _GROUP.get(), {"scored": False}
    token = _SLOT.set(slot)
    try:
        return await play
    finally:
        _SLOT.reset(token)
        if batch is not None and not slot["scored"]:
            await batch.leave()


async def call_reward(
    fn: Callable[..., Any], name: str, prompt_column: str, entries: Sequence[Entry]
) -> list[float | RewardError]:
    """One call of `fn` over `entries`: per entry its reward or its error (see the module docstring)."""
    ids = [e.task_id for e in entries]
    where = f"reward {name} on {ids[0] if len(set(ids)) == 1 else ids}"
    columns = [k for k in entries[0].columns if k not in ("prompts", "completions", prompt_column)]
    kwargs = {k: [e.columns.get(k) for e in entries] for k in columns}
    try:
        out = fn(
            prompts=[e.columns[prompt_column] for e in entries],
            completions=[e.completion for e in entries],
            **kwargs,
        )
        if inspect.isawaitable(out):
            out = await out
    except Exception as exc:
        return [RewardError(f"{where} raised {type(exc).__name__}: {exc}") for _ in entries]
    values = list(out) if isinstance(out, list | tuple) else None
    if values is None or len(values) != len(entries):
        n = f"{len(entries)} completion{'' if len(entries) == 1 else 's'}"
        return [RewardError(f"{where} returned {out!r} for {n}: {SHAPE}") for _ in entries]
    return [
        float(v)
        if not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
        else RewardError(f"{where} returned {v!r} for {nth(i, len(values))}: need a finite number")
        for i, v in enumerate(values)
    ]


def nth(i: int, n: int) -> str:
    return "the completion" if n == 1 else f"completion {i} of {n}"


class Scorer:
    """A dataset task's reward, batched per group when a `group` is open."""

    def __init__(self, fn: Callable[..., Any], name: str, prompt_column: str) -> None:
        self.fn, self.name, self.prompt_column = fn, name, prompt_column

    async def score(self, columns: Mapping[str, Any], task_id: str, completion: Any) -> float:
        result: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        batch = _GROUP.get() or RewardBatch(1)  # outside a group: a group of one, scored at once
        return await batch.score(Entry(columns, task_id, completion, result), self._call)

    async def _call(self, entries: list[Entry]) -> None:
        values = await call_reward(self.fn, self.name, self.prompt_column, entries)
        for entry, value in zip(entries, values, strict=True):
            assert entry.result is not None
            if isinstance(value, RewardError):
                entry.result.set_exception(value)
            else:
                entry.result.set_result(value)

    def probe(self, columns: Mapping[str, Any], task_id: str, completions: list[Any]) -> list[str]:
        """Call the function once, at start, on `completions` of one row (in a thread of its own).
        Raises RewardError on a result of the wrong shape (every episode would fail); returns the
        other errors, which may be the made-up completions' own."""
        entries = [Entry(columns, task_id, c) for c in completions]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            run = pool.submit(asyncio.run, call_reward(self.fn, self.name, self.prompt_column, entries))
            results = run.result()
        errors = [str(r) for r in results if isinstance(r, RewardError)]
        if any(SHAPE in e for e in errors):
            raise RewardError(f"the start-up probe: {errors[0]}")
        return errors
