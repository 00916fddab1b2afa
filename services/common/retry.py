"""Retrying through transient failures (a broker restart, a stream leader election, an engine that is
not up yet): one helper, `backoff`, that every retry in swarmrl goes through.

A merger that cannot publish must wait, not drop the episode: its events stay unacked meanwhile, so
waiting loses nothing. Only a stop request ends the wait (`retry` raises `Stopping`), leaving the
message unacked for the next merger to replay.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
import tenacity

log = logging.getLogger("swarmrl.retry")

TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
"""NATS failures that pass; anything else (a rejected publish, a bug) propagates."""
DUPLICATE_IN_PROCESS = 10158
"""JetStream's `duplicate message id is in process` (409): an earlier try of the same publish (same
`Nats-Msg-Id`) is still being stored, as after a publish whose ack timed out while the stream's leader
was out of reach (`bench/results/partitions.md`). It passes too: trying again gets that one's ack, or
stores the message if the earlier try failed."""


def passes(exc: BaseException, transient: tuple[type[BaseException], ...] = TRANSIENT) -> bool:
    """Whether `exc` is a failure worth trying again: one of `transient`, or a publish still in process."""
    in_process = isinstance(exc, nats.js.errors.APIError) and exc.err_code == DUPLICATE_IN_PROCESS
    return isinstance(exc, transient) or in_process


T = TypeVar("T")


class Stopping(Exception):
    """Raised out of a retry loop when the service is asked to stop; the message stays unacked."""


async def backoff(
    action: Callable[[], Awaitable[T]],
    *,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
    seconds: float | None = None,
    tries: int | None = None,
    stop: asyncio.Event | None = None,
    first_s: float = 0.1,
    max_s: float = 2.0,
    what: str = "",
) -> T:
    """Await `action()` and return what it returns; on a `transient` failure (or a publish still in
    process, `DUPLICATE_IN_PROCESS`) wait (`first_s`, doubling up to `max_s`) and try again, until
    `seconds` have passed, `tries` attempts were made or `stop` is set (none of them: forever). Then
    the last failure propagates. `what`: each retry is logged as a warning naming it."""
    ends: list[tenacity.stop.stop_base] = [tenacity.stop_after_delay(seconds)] if seconds is not None else []
    ends += [tenacity.stop_after_attempt(tries)] if tries is not None else []
    ends += [tenacity.stop_when_event_set(stop)] if stop is not None else []  # type: ignore[arg-type]  # is_set() alike

    def log_retry(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay)

    async for attempt in tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(lambda exc: passes(exc, transient)),
        stop=tenacity.stop_any(*ends),
        wait=tenacity.wait_exponential(multiplier=first_s, max=max_s),
        before_sleep=log_retry if what else None,
        reraise=True,
    ):
        with attempt:
            return await action()
    raise AssertionError("unreachable: tenacity re-raises the last failure")


async def retry(stop: asyncio.Event, action: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Await `action(*args, **kwargs)` until it succeeds and return what it returns, backing off
    (0.1 s doubling to 5 s) on transient failures; a stop request turns the next one into `Stopping`."""
    call = functools.partial(action, *args, **kwargs)
    try:
        return await backoff(call, stop=stop, max_s=5.0, what=getattr(action, "__name__", repr(action)))
    except Exception as exc:
        if passes(exc):  # re-raised only once the stop was requested
            raise Stopping from exc
        raise
