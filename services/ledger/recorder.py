"""One consumer of the ledger: fetch -> rows -> flush when due -> ack what is durable.

A `Recorder` reads one stream (or one partition of LEDGER_PARTS) in stream order: each message is
buffered in its `StreamSink`, skipped (a redelivery) or dead-lettered before the next is looked at.
Buffers are written in the background, one write at a time and in order, and the messages they
cover are acked once their files are durable. It is the only code that acks its consumer's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import WireError
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.retry import backoff
from swarmrl.services.ledger.columns import TableBuffer
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.ingest import Ingest, Rejected
from swarmrl.services.ledger.store import Fenced, PartWriter
from swarmrl.services.ledger.tables import Row

if TYPE_CHECKING:
    from swarmrl.services.ledger.service import Ledger

log = logging.getLogger("swarmrl.ledger")
CONSUMER_CHECK_S = 5.0
"""Replicas: how often an idle partition checks that its consumer still exists."""


class LeaseLost(Fenced):
    """A replica's partition lease may have passed to another replica: its work stops at once."""


@dataclass
class StreamSink:
    """Rows of one stream waiting for their flush, and the message whose ack will cover them (acks
    are cumulative, `AckPolicy.ALL`, and messages are handled strictly in stream order)."""

    stream: str
    sourced: bool = False
    """A partition of LEDGER_PARTS (ledger replicas): sequences are EPISODES' (`bus.source_seq`), and
    each message is acked once its row is durable (a work queue takes no cumulative acks)."""
    owned: Callable[[], bool] | None = None
    """Replicas: whether the partition's lease is still ours (a flush is dropped unwritten if not)."""
    covered: list[Msg] = field(default_factory=list)
    """Sourced: the buffered messages, acked after their flush."""
    durable_seq: int = 0
    """Every message of the stream up to this sequence is on disk or dead-lettered."""
    last_seq: int = 0
    """Every message up to this sequence is handled: buffered, on disk or dead-lettered."""
    last: Msg | None = None
    """The message at `last_seq` if not yet acked (its ack acks everything before it)."""
    early: dict[int, Msg] = field(default_factory=dict)
    """Not sourced: messages that came before one they follow (a fetch's reply late or lost in the
    network), held by sequence until the gap is filled (by the late reply, or its redelivery)."""
    writing: asyncio.Task[None] | None = None
    """The write of the previous buffers, while in progress."""
    buffers: dict[str, TableBuffer] = field(default_factory=dict)
    rows: int = 0
    nbytes: int = 0
    first_at: float = 0.0
    large_at: float = float("-inf")
    """When the last large write was taken (`flush_idle_rows` rows or `flush_bytes`): a burst."""

    def add(self, table: str, row: Row, msg: Msg, seq: int) -> None:
        if not self.rows:
            self.first_at = time.monotonic()
        if table not in self.buffers:
            self.buffers[table] = TableBuffer(table)
        self.buffers[table].append(row)
        self.rows += 1
        self.nbytes += len(msg.data)
        self.last, self.last_seq = msg, seq
        if self.sourced:
            self.covered.append(msg)

    def take_acks(self) -> list[Msg]:
        """The messages whose acks the next flush owns: each buffered one (sourced), else the latest."""
        acks = self.covered if self.sourced else [m for m in (self.last,) if m is not None]
        self.covered, self.last = [], None
        return acks

    def due(self, cfg: LedgerConfig, idle: bool = False) -> bool:
        """Time to write: `flush_rows` or `flush_bytes` waiting, or rows `flush_interval_s` old; or,
        `idle` (a poll found nothing new), `flush_idle_rows` waiting or the tail of a burst."""
        if not self.rows:
            return False
        if self.rows >= cfg.flush_rows or self.nbytes >= cfg.flush_bytes:
            return True
        now = time.monotonic()
        if now - self.first_at >= cfg.flush_interval_s:
            return True
        burst = now - self.large_at < cfg.flush_interval_s
        return idle and (burst or self.rows >= cfg.flush_idle_rows)

    def take(self, cfg: LedgerConfig) -> tuple[dict[str, TableBuffer], int]:
        """Hand over the buffers and their row count; start afresh."""
        taken = self.buffers, self.rows
        if self.rows >= min(cfg.flush_idle_rows, cfg.flush_rows) or self.nbytes >= cfg.flush_bytes:
            self.large_at = time.monotonic()
        self.buffers, self.rows, self.nbytes = {}, 0, 0
        return taken


class Recorder:
    """Records `sink.stream` from `sub` until `stop` (then what the stream held, `stop_drain_s`)."""

    def __init__(
        self,
        ledger: Ledger,
        sink: StreamSink,
        sub: JetStreamContext.PullSubscription,
        stop: asyncio.Event,
        ingest: Ingest,
        writer: PartWriter,
    ) -> None:
        assert ledger.dlq is not None, "the ledger connects first"
        self.cfg, self.dlq, self.counts, self.fetched = ledger.cfg, ledger.dlq, ledger.counts, ledger.fetched
        self.sink, self.sub, self.stop, self.writer = sink, sub, stop, writer
        self.ingest = ingest

    async def run(self) -> None:
        cfg, sink = self.cfg, self.sink
        # No poison check: one ack acks every earlier message.
        batches = bus.batches(
            self.sub,
            self.stop,
            cfg.fetch_batch,
            cfg.poll_interval_s,
            dead_letters=None,
            drain_s=cfg.stop_drain_s,
        )
        checked = time.monotonic()
        try:
            async for msgs in batches:
                if sink.owned is not None and not sink.owned():
                    raise LeaseLost(f"lease on {sink.stream} lost: {sink.rows} rows left to its next owner")
                if sink.sourced and not msgs and time.monotonic() - checked > CONSUMER_CHECK_S:
                    checked = time.monotonic()
                    await self._still_ours()
                self.fetched[sink.stream] += len(msgs)
                complete = await self.record(msgs)
                if sink.due(cfg, idle=not msgs):
                    await self.start_flush()
                elif sink.writing is not None and sink.writing.done():
                    await self.finish_flush()
                await self.ack_settled()
                if not complete:
                    break  # stopping while the DLQ is unreachable: the rest is redelivered later
            await self.start_flush()
        except Fenced:  # a replica's partition: the write begun while it was ours ends first
            with contextlib.suppress(Fenced):
                await self.finish_flush()
            raise
        await self.finish_flush()
        await self.ack_settled()

    async def _still_ours(self) -> None:
        """A partition's consumer deleted means another replica took the partition: stop."""
        try:
            await self.sub.consumer_info()
        except NotFoundError as exc:
            raise LeaseLost("the partition's consumer was deleted: another replica owns it") from exc
        except (nats.errors.Error, TimeoutError) as exc:  # the broker is away: look again later
            log.debug("consumer check failed: %r", exc)

    async def record(self, msgs: list[Msg]) -> bool:
        """Buffer, skip or dead-letter each message, in order. False: stopped at a message that could
        not be dead-lettered while stopping (it and the rest are left unacked, for redelivery)."""
        sink = self.sink
        queue = deque(msgs)
        while queue or sink.last_seq + 1 in sink.early:  # plain: no coroutine per message
            held = sink.early.pop(sink.last_seq + 1, None)  # next in order, if it came early
            msg = held if held is not None else queue.popleft()
            seq = bus.source_seq(msg) if sink.sourced else msg.metadata.sequence.stream
            if seq <= sink.last_seq:  # redelivered (its ack was late): already handled, its ack will come
                self.counts["redelivered"] += 1
                if seq <= sink.durable_seq:
                    await self._ack(msg)
                continue
            if not sink.sourced and sink.last_seq and seq > sink.last_seq + 1:
                # An earlier fetch's reply is late or lost: acking past the gap would ack the missing
                # messages unwritten (cumulative acks). Hold this one until they come.
                self.counts["held_for_order"] += 1
                sink.early[seq] = msg
                continue
            try:
                table, row = self.ingest.row(sink.stream, msg, seq)
            except Exception as exc:  # the loop survives any message: a failure to make a row dead-letters it
                if sink.stream == S.DLQ_STREAM:  # never dead-letter a dead letter (it would loop)
                    log.error("unrecordable dead letter subject=%s seq=%d: %r", msg.subject, seq, exc)
                    self.counts["dead_letters_unrecorded"] += 1
                else:
                    reason = str(exc) if isinstance(exc, WireError | Rejected) else f"internal: {exc!r}"
                    if not await self.dead_letter(msg, reason):
                        return False
                if sink.sourced:  # acked on its own: nothing else rides on its ack
                    sink.last_seq = seq
                    await self._ack(msg)
                    continue
                sink.last, sink.last_seq = msg, seq
                await self.ack_settled()
                continue
            sink.add(table, row, msg, seq)
        return True

    async def dead_letter(self, msg: Msg, reason: str) -> bool:
        """Retry until the DLQ takes it (False: stopped first): acking without that would drop it."""
        try:
            await backoff(
                partial(self.dlq.send, msg, reason), transient=(Exception,), stop=self.stop, first_s=0.2,
                max_s=5.0, what=f"dead-letter of subject={msg.subject}",
            )  # fmt: skip
            return True
        except Exception:  # the loop survives any failure to publish: stopped while the DLQ was away
            return False

    async def start_flush(self) -> None:
        """Write what is buffered in the background; one write per stream at a time, in order."""
        sink = self.sink
        await self.finish_flush()
        if not sink.rows:
            return
        buffers, rows = sink.take(self.cfg)
        covering = sink.take_acks()  # this write owns the ack of everything up to it
        if sink.owned is not None and not sink.owned():
            # Write nothing more: the partition's next owner replays these from the files' end.
            raise LeaseLost(f"partition lease lost: {rows} rows of {sink.stream} left to its next owner")
        sink.writing = asyncio.create_task(self._write(buffers, rows, sink.last_seq, covering))

    async def finish_flush(self) -> None:
        if self.sink.writing is not None:
            task, self.sink.writing = self.sink.writing, None
            await task  # re-raises what is not an OSError: a bug, which stops the service

    async def _write(self, buffers: dict[str, TableBuffer], rows: int, top: int, covering: list[Msg]) -> None:
        sink = self.sink
        # Disk full, permissions: the messages stay unacked while it retries; stopped, it raises.
        paths = await backoff(
            partial(asyncio.to_thread, write_files, buffers, self.writer, sink.owned), transient=(OSError,),
            stop=self.stop, first_s=0.5, max_s=10.0, what=f"flush of {sink.stream}",
        )  # fmt: skip
        sink.durable_seq = max(sink.durable_seq, top)
        for table, buffer in buffers.items():
            self.counts[table] += buffer.rows
        log.debug("flushed stream=%s rows=%d files=%d up to seq %d", sink.stream, rows, len(paths), top)
        for msg in covering:
            await self._ack(msg)

    async def ack_settled(self) -> None:
        """Ack the latest handled message if nothing below it waits for a write (dead letters only)."""
        sink = self.sink
        if sink.last is not None and not sink.rows and sink.writing is None:
            sink.durable_seq = sink.last_seq
            msg, sink.last = sink.last, None
            await self._ack(msg)

    async def _ack(self, msg: Msg) -> None:
        try:
            await msg.ack()
        except Exception as exc:  # the loop survives a lost ack: a redelivery, which durable_seq skips
            log.debug("ack failed subject=%s: %r", msg.subject, exc)


def write_files(
    buffers: dict[str, TableBuffer], writer: PartWriter, owned: Callable[[], bool] | None
) -> list:
    """In a worker thread (Arrow, compression and fsync release the GIL); a replica's files land only
    if `owned()` still holds once they are written."""
    return writer.write_group({table: buffer.to_arrow() for table, buffer in buffers.items()}, owned)
