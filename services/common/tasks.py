"""Waiting on a service's background tasks: shared by every service that runs several loops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def until_stopped(stop: asyncio.Event, tasks: Iterable[asyncio.Task[object]]) -> None:
    """Return when `stop` is set. If one of `tasks` ends first, set `stop` and raise: its exception,
    or a RuntimeError when it returned; a service never keeps running with one of its loops dead."""
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    stopping = stop.is_set()  # a loop may end in the same instant as the stop: that is no failure
    for task in done:
        if task is not stopper:
            stop.set()
            task.result()  # raises the failure
            if not stopping:
                raise RuntimeError(f"{task.get_name()} ended unexpectedly")
