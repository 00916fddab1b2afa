"""Retrying NATS calls through broker hiccups (a server restart, a stream leader election).

A merger that cannot publish must wait, not drop the episode: its events stay unacked meanwhile, so
waiting loses nothing. Only a stop request ends the wait (`Stopping`), leaving the message unacked
for the next merger to replay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors

log = logging.getLogger("swarmrl.retry")

TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
"""Failures that pass; anything else (a rejected publish, a bug) propagates."""


class Stopping(Exception):
    """Raised out of a retry loop when the service is asked to stop; the message stays unacked."""


async def retry(
    stop: asyncio.Event, action: Callable[..., Awaitable[object]], *args: Any, **kwargs: Any
) -> None:
    """Await `action(*args, **kwargs)` until it succeeds, backing off on transient failures."""
    delay = 0.1
    while True:
        try:
            await action(*args, **kwargs)
            return
        except TRANSIENT as exc:
            if stop.is_set():
                raise Stopping from exc
            log.warning(
                "%s failed (%s: %s); retrying in %.1fs", action.__name__, type(exc).__name__, exc, delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
