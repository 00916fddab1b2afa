"""Waiting on a service's background tasks, and running one until a signal: shared by the services."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable
from typing import Protocol


class Loops:
    """A service's background loops and its stop flag: `request_stop()` sets the flag, `wait()`
    returns then, or raises as soon as one of the loops dies (`until_stopped`)."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def request_stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        await until_stopped(self._stop, self._tasks)


class Service(Protocol):
    """A service's lifecycle: `start()`, `wait()` until stopped, then `stop()`."""

    async def start(self) -> None: ...
    async def wait(self) -> None: ...
    async def stop(self) -> None: ...
    def request_stop(self) -> None: ...


async def serve_until_signalled(service: Service) -> None:
    """Start `service` and run it until SIGINT or SIGTERM (or until one of its loops dies), then stop it."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, service.request_stop)
    try:
        await service.start()
        await service.wait()
    finally:
        await service.stop()


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
