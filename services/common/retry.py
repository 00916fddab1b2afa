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
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

log = logging.getLogger("swarmrl.retry")

TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
"""Failures that pass; anything else (a rejected publish, a bug) propagates."""
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


async def retry(stop: asyncio.Event, action: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Await `action(*args, **kwargs)` until it succeeds and return what it returns, backing off
    (0.1 s doubling to 5 s) on transient failures; a stop request turns the next one into `Stopping`."""

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s failed (%s: %s); retrying in %.1fs", action.__name__, type(exc).__name__, exc, delay)

    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(passes),
            stop=lambda _: stop.is_set(),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            before_sleep=log_retry,
            reraise=True,
        ):
            with attempt:
                result = await action(*args, **kwargs)
    except Exception as exc:
        if passes(exc):  # re-raised by tenacity only once the stop was requested
            raise Stopping from exc
        raise
    return result


async def within(
    seconds: float,
    action: Callable[..., Awaitable[T]],
    *args: Any,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
    **kwargs: Any,
) -> T:
    """Await `action(*args, **kwargs)` through `transient` failures (and `DUPLICATE_IN_PROCESS`) for up
    to `seconds` (backing off 0.1 s doubling to 2 s), then let the last one propagate. For setup that has no stop event yet,
    and for the agents' SDK, which gives up after its `retry_s`.

    A config reload of nats-server (a study adding a run's account, `up` minting an agent) makes
    JetStream API calls of *other* accounts answer 503 for a moment: measured on nats-server 2.15,
    stream info and KV gets failed in about 3 of 10 reloads, and a new run's stream setup in 7 of 10
    when the next run's account was added right after (`tests/integration/test_research_accounts.py`)."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(lambda exc: passes(exc, transient)),
        stop=stop_after_delay(seconds),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    ):
        with attempt:
            return await action(*args, **kwargs)
    raise AssertionError("unreachable: tenacity re-raises the last failure")
