"""Batches from a JetStream pull consumer, read through plain NATS subscriptions.

Consumes: the consumer's messages, delivered to a private inbox in answer to pull requests sent to
the JetStream API (`CONSUMER.MSG.NEXT.<stream>.<durable>`). Publishes: nothing but those requests.

Why not `bus.batches` (nats-py's `PullSubscription.fetch`): fetch waits for every message with its
own task, `wait_for` and uuid, about 70 µs of CPU per message on a 2-core machine, which was more
than the ledger's whole decode-validate-write path. Here the messages are appended to a list as
`client.Delivery` tuples (a run at a time through `client.PullClient`'s short path when the connection
is one), and `fetch` hands the list over once the server has sent what the stream holds (`no_wait`
requests).

When to ask (`pull_batches`): at once after a full batch (the next request goes out before the batch
is handed over, so the server sends while the consumer decodes); after a short one, when about a
quarter batch should be waiting (`PollPace`); after an empty one, a "doorbell" request for a single
message, which the server holds open for `poll_s` and answers the moment one is stored. So a quiet
stream costs one request per `poll_s`, and a burst is read from its first message on.
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

from swarmrl.services.ledger.client import Delivery, PullClient

log = logging.getLogger("swarmrl.ledger.pull")

MAX_BATCH_BYTES = 64 * 1024 * 1024
"""Byte bound of one pull request; above the largest message the streams accept (8 MiB)."""
WAKE_LINGER_S = 0.005
"""After the doorbell rings, let a burst's first messages gather this long before the first fetch."""


class BatchPuller:
    """One batch request at a time; `fetch` returns what arrived, in stream order.

    `headers=False`: the messages may come without their headers (`PullClient`'s short path).
    """

    def __init__(
        self, nc: NATS, stream: str, durable: str, prefix: str = DEFAULT_PREFIX, *, headers: bool = True
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.next_subject = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = nc.new_inbox()
        self.bell_inbox = nc.new_inbox()
        self.headers = headers
        self._arrived: list[Delivery] = []
        self._want = 0  # messages the outstanding batch request may still deliver; 0: none outstanding
        self._ready = asyncio.Event()
        self._bell_until = 0.0  # while the doorbell request is open (loop time); 0: none
        self._rang = asyncio.Event()
        self._subs: list[Subscription] = []
        self.requests = 0
        """Pull requests sent (with `delivered`: the mean batch size, in the ledger's final log line)."""
        self.delivered = 0

    async def start(self) -> None:
        for inbox, on_msgs, on_status in (
            (self.inbox, self._arrive, self._request_over),
            (self.bell_inbox, self._ring, self._bell_over),
        ):

            async def cb(msg: Msg, on_msgs=on_msgs, on_status=on_status) -> None:  # nats-py's path
                if not msg.data and msg.headers and Header.STATUS in msg.headers:
                    on_status(f"{msg.headers[Header.STATUS]} {msg.headers.get(Header.DESCRIPTION)}")
                else:
                    on_msgs([Delivery.of(msg)])

            # pending_bytes_limit=0: no client-side cap (the pull request bounds a batch), so a
            # burst is never dropped as a slow consumer.
            sub = await self.nc.subscribe(inbox, cb=cb, pending_msgs_limit=1_000_000, pending_bytes_limit=0)
            if isinstance(self.nc, PullClient) and not self.headers:  # before the first request
                self.nc.short_path(sub, on_msgs, on_status)
            self._subs.append(sub)

    async def close(self) -> None:
        for sub in self._subs:
            if isinstance(self.nc, PullClient):
                self.nc.short_path(sub, None)
            if not self.nc.is_closed:
                await sub.unsubscribe()
        self._subs = []

    def _arrive(self, msgs: list[Delivery]) -> None:
        self._arrived += msgs
        self._want = max(self._want - len(msgs), 0)
        if self._want == 0:
            self._ready.set()

    def _request_over(self, status: str) -> None:
        # 404 no messages, 408 request expired, 409 batch completed / consumer changed: request over.
        log.debug("pull request ended: %s", status)
        self._want = 0
        self._ready.set()

    def _ring(self, msgs: list[Delivery]) -> None:
        # The stream's next message, in order: the server serves pull requests first come, first
        # served, and a batch request sent after the doorbell's gets what follows it.
        self._arrived += msgs
        self._bell_over("rang")

    def _bell_over(self, status: str) -> None:
        self._bell_until = 0.0
        self._rang.set()

    async def request(self, batch: int) -> None:
        """Ask for up to `batch` messages unless a request is outstanding or enough have arrived."""
        if self._want == 0 and len(self._arrived) < batch:
            self._ready.clear()
            self._want = batch - len(self._arrived)
            request = {"batch": self._want, "no_wait": True, "max_bytes": MAX_BATCH_BYTES}
            await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self.inbox)
            self.requests += 1

    async def fetch(self, batch: int, timeout: float = 5.0) -> list[Delivery]:
        """Up to `batch` messages the stream holds now (`no_wait`: the server answers at once)."""
        await self.request(batch)
        if self._want > 0:
            try:  # the answer is immediate; the timeout only covers a lost one
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                self._want = 0
        msgs, self._arrived = self._arrived, []
        self.delivered += len(msgs)
        return msgs

    async def doorbell(self, stop: asyncio.Event, timeout: float) -> bool:
        """Wait up to `timeout` (or until `stop`) for the stream's next message; True if it came.

        A request for one message that the server holds open (`expires`); its message joins the
        next `fetch`. A doorbell that outlives a stop is harmless: whatever it delivers after the
        last fetch is never acked, and JetStream delivers it again.
        """
        if self._arrived:
            return True
        now = asyncio.get_running_loop().time()
        if self._bell_until < now:  # none open (or its expiry notice was lost)
            self._rang.clear()
            self._bell_until = now + timeout + 1.0
            request = {"batch": 1, "expires": int(timeout * 1e9), "max_bytes": MAX_BATCH_BYTES}
            try:
                await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self.bell_inbox)
                self.requests += 1
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                self._bell_until = 0.0  # not sent: wait out `timeout` and try again
        waits = [asyncio.ensure_future(self._rang.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout + 1.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return bool(self._arrived)


class PollPace:
    """How long a caught-up consumer waits before it asks again: about as long as `target` new
    messages take to arrive at the recent rate, at most `poll_s`.

    A busy stream is polled often enough that its messages are written within milliseconds of their
    publish, yet each fetch still brings a batch. Pure logic: the caller passes the clock.
    """

    def __init__(self, poll_s: float, target: int, now: float) -> None:
        self.poll_s = poll_s
        self.target = target
        self.rate = 0.0
        """Messages per second, smoothed over the last few fetches."""
        self._last = now
        self._fresh = True

    def woke(self, now: float) -> None:
        """Traffic (re)started at `now` after a quiet spell: forget the old rate."""
        self._last, self._fresh = now, True

    def wait(self, got: int, now: float) -> float:
        """Note a fetch of `got` messages at `now`; the pause before the next one, should it be short."""
        elapsed, self._last = max(now - self._last, 1e-3), now
        rate = got / elapsed
        self.rate = rate if self._fresh else 0.5 * self.rate + 0.5 * rate
        self._fresh = False
        if got == 0 or self.rate * self.poll_s <= self.target:
            return self.poll_s
        return self.target / self.rate


async def pull_batches(
    puller: BatchPuller, stop: asyncio.Event, batch: int, poll_s: float, drain_s: float = 0.0
) -> AsyncIterator[list[Delivery]]:
    """Like `bus.batches`: yield batches until `stop` is set, [] when there is nothing new (at least
    every `poll_s`, so the consumer can act on time).

    Once `stop` is set it goes on for up to `drain_s` seconds, until a batch comes back short: what
    the stream held when the stop came is still taken (the last poll interval's messages included).
    """
    loop = asyncio.get_running_loop()
    pace = PollPace(poll_s, max(batch // 4, 1), loop.time())
    quiet = False
    while not stop.is_set():
        if quiet:  # the last fetch found nothing: wait for the next message rather than polling
            if not await puller.doorbell(stop, poll_s):
                yield []
                continue
            pace.woke(loop.time())
            try:
                await asyncio.wait_for(stop.wait(), min(WAKE_LINGER_S, poll_s))
            except TimeoutError:
                pass
        try:
            msgs = await puller.fetch(batch)
            if len(msgs) >= batch:
                await puller.request(batch)
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
            msgs = []
        next_at = loop.time() + pace.wait(len(msgs), loop.time())  # the pause counts from the fetch
        yield msgs
        quiet = not msgs
        if msgs and len(msgs) < batch and next_at > loop.time():
            try:
                await asyncio.wait_for(stop.wait(), next_at - loop.time())
            except TimeoutError:
                pass
    deadline = loop.time() + drain_s
    while loop.time() < deadline:
        try:
            msgs = await puller.fetch(batch)
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
            return
        yield msgs
        if len(msgs) < batch:
            return
