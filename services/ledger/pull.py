"""Batches from a JetStream pull consumer, read through one plain NATS subscription.

Consumes: the consumer's messages, delivered to a private inbox in answer to pull requests sent to
the JetStream API (`CONSUMER.MSG.NEXT.<stream>.<durable>`). Publishes: nothing but those requests.

Why not `bus.batches` (nats-py's `PullSubscription.fetch`): fetch waits for every message with its
own task, `wait_for` and uuid, about 70 µs of CPU per message on a 2-core machine, which was more
than the ledger's whole decode-validate-write path. Here a subscription callback appends each
message to a list (about 20 µs per message, mostly nats-py's protocol parsing), and `fetch` hands
the list over once the server has sent what the stream holds (`no_wait` requests).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DEFAULT_PREFIX, Header

log = logging.getLogger("swarmrl.ledger.pull")

MAX_BATCH_BYTES = 64 * 1024 * 1024
"""Byte bound of one pull request; above the largest message the streams accept (8 MiB)."""


class BatchPuller:
    """One pull request at a time; `fetch` returns what it delivered, in stream order."""

    def __init__(self, nc: NATS, stream: str, durable: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.nc = nc
        self.stream = stream
        self.next_subject = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = nc.new_inbox()
        self._arrived: list[Msg] = []
        self._want = 0  # messages the outstanding request may still deliver; 0: none outstanding
        self._ready = asyncio.Event()
        self._sub: Subscription | None = None
        self.requests = 0
        """Pull requests sent (with `delivered`: the mean batch size, in the ledger's final log line)."""
        self.delivered = 0

    async def start(self) -> None:
        # pending_bytes_limit=0: no client-side cap (the pull request bounds a batch), so a burst is
        # never dropped as a slow consumer.
        self._sub = await self.nc.subscribe(
            self.inbox, cb=self._on_msg, pending_msgs_limit=1_000_000, pending_bytes_limit=0
        )

    async def close(self) -> None:
        if self._sub is not None and not self.nc.is_closed:
            await self._sub.unsubscribe()

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.data and msg.headers and Header.STATUS in msg.headers:
            # 404 no messages, 408 request expired, 409 batch completed / consumer changed: request over.
            log.debug(
                "pull request ended: %s %s", msg.headers[Header.STATUS], msg.headers.get(Header.DESCRIPTION)
            )
            self._want = 0
            self._ready.set()
            return
        self._arrived.append(msg)
        self._want = max(self._want - 1, 0)
        if self._want == 0:
            self._ready.set()

    async def fetch(self, batch: int, timeout: float = 5.0) -> list[Msg]:
        """Up to `batch` messages the stream holds now (`no_wait`: the server answers at once)."""
        if self._want == 0 and len(self._arrived) < batch:
            self._ready.clear()
            self._want = batch - len(self._arrived)
            request = {"batch": self._want, "no_wait": True, "max_bytes": MAX_BATCH_BYTES}
            await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self.inbox)
            self.requests += 1
            try:  # the answer is immediate; the timeout only covers a lost one
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                self._want = 0
        msgs, self._arrived = self._arrived, []
        self.delivered += len(msgs)
        return msgs


async def pull_batches(
    puller: BatchPuller, stop: asyncio.Event, batch: int, poll_s: float, drain_s: float = 0.0
) -> AsyncIterator[list[Msg]]:
    """Like `bus.batches`: yield batches until `stop` is set, [] when there is nothing new.

    Caught up (a short batch), it waits `poll_s` before asking again rather than keeping a request
    open: what is published meanwhile then arrives in one burst, where an open request would take
    messages one by one as they come, at several times the CPU per message.

    Once `stop` is set it goes on for up to `drain_s` seconds, until a batch comes back short: what
    the stream held when the stop came is still taken (the last poll interval's messages included).
    """
    while not stop.is_set():
        try:
            msgs = await puller.fetch(batch)
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
            msgs = []
        yield msgs
        if len(msgs) < batch:
            try:
                await asyncio.wait_for(stop.wait(), poll_s)
            except TimeoutError:
                pass
    deadline = asyncio.get_running_loop().time() + drain_s
    while asyncio.get_running_loop().time() < deadline:
        try:
            msgs = await puller.fetch(batch)
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
            return
        yield msgs
        if len(msgs) < batch:
            return
