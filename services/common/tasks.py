"""Waiting on a service's background tasks, and running one until a signal: shared by the services."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

log = logging.getLogger("swarmrl.tasks")


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `event`; whether it is set: a loop's sleep that a stop ends at once."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


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

    async def finish(self, grace_s: float = 5.0) -> None:
        """Set the stop flag and let the loops end on their own for `grace_s`, then cancel the rest: a
        loop blocked on a dead dependency (a NATS request while the server is gone) never holds up
        the stop."""
        self._stop.set()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class Background:
    """Tasks a service starts and does not await: it keeps each until it ends (the event loop holds
    tasks only weakly, so an unreferenced one may vanish mid-run) and cancels those left on `close()`."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failed: list[BaseException] = []  # errors of `spawn(..., watched=True)` tasks

    def spawn(
        self, coro: Coroutine[Any, Any, Any], name: str | None = None, watched: bool = False
    ) -> asyncio.Task[Any]:
        """Run `coro` as a task; a `watched` one that ends with an error has it re-raised by `close()`
        (a service's watch loop must not die unnoticed)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if watched:
            task.add_done_callback(self._keep_error)
        return task

    def _keep_error(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failed.append(task.exception())  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        """Cancel every running task, without waiting for them to end."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Cancel every running task and wait until all have ended; then re-raise the first error of a
        watched task."""
        tasks = list(self._tasks)
        self.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._failed:
            raise self._failed[0]


class Service(Protocol):
    """A service's lifecycle: `start()`, `wait()` until stopped, then `stop()`."""

    async def start(self) -> None: ...
    async def wait(self) -> None: ...
    async def stop(self) -> None: ...
    def request_stop(self) -> None: ...


def on_signals(handler: Callable[[], object]) -> None:
    """Call `handler()` on SIGINT or SIGTERM (in the running event loop): a service's stop request."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handler)


async def serve_until_signalled(service: Service) -> None:
    """Start `service` and run it until SIGINT or SIGTERM (or until one of its loops dies), then stop it.
    A signal during `start()` cancels the start (it may be waiting on a NATS server that is gone)."""
    starting = asyncio.create_task(service.start(), name="start")

    def on_signal() -> None:
        starting.cancel()  # a no-op once started
        service.request_stop()

    on_signals(on_signal)
    try:
        await asyncio.wait([starting])  # the start's outcome is read below
        if not starting.cancelled():
            starting.result()
            await service.wait()
    finally:
        await service.stop()


async def until_stopped(stop: asyncio.Event, tasks: Iterable[asyncio.Task[object]]) -> None:
    """Return when `stop` is set. If one of `tasks` ends first, set `stop` and raise: its exception,
    or a RuntimeError when it returned; a service never keeps running with one of its loops dead.
    A loop's failure is logged here, as it happens: the service's stop may hang after it (on a
    dead broker), and its traceback would then never reach the log."""
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    stopping = stop.is_set()  # a loop may end in the same instant as the stop: that is no failure
    for task in done:
        if task is not stopper:
            stop.set()
            if not task.cancelled() and (failed := task.exception()) is not None:
                log.error("%s failed: stopping the service", task.get_name(), exc_info=failed)
            task.result()  # raises the failure
            if not stopping:
                raise RuntimeError(f"{task.get_name()} ended unexpectedly")
