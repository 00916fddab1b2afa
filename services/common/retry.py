"""Retrying NATS calls through broker hiccups (a server restart, a stream leader election).

A merger that cannot publish must wait, not drop the episode: its events stay unacked meanwhile, so
waiting loses nothing. Only a stop request ends the wait (`Stopping`), leaving the message unacked
for the next merger to replay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

log = logging.getLogger("swarmrl.retry")

TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
"""Failures that pass; anything else (a rejected publish, a bug) propagates."""


T = TypeVar("T")


class Stopping(Exception):
    """Raised out of a retry loop when the service is asked to stop; the message stays unacked."""


async def retry(stop: asyncio.Event, action: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Await `action(*args, **kwargs)` until it succeeds and return what it returns, backing off
    (0.1 s doubling to 5 s) on transient failures; a stop request turns the next one into `Stopping`."""

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s failed (%s: %s); retrying in %.1fs", action.__name__, type(exc).__name__, exc, delay)

    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT),
            stop=lambda _: stop.is_set(),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            before_sleep=log_retry,
            reraise=True,
        ):
            with attempt:
                result = await action(*args, **kwargs)
    except TRANSIENT as exc:  # re-raised by tenacity only once the stop was requested
        raise Stopping from exc
    return result
