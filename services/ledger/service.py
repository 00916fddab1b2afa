"""NATS side of the ledger: one durable pull consumer per stream, ack / dead-letter decisions, flushes.

Consumes: EPISODES (`swarm.ep.>`), SAMPLES (`swarm.samples.>`), METRICS (`swarm.metrics.>`) and
DLQ (`swarm.dlq.>`), each with its durable consumer `ledger-<stream>` (`bus.durable_pull`), read in
batches with nats-py's `PullSubscription.fetch` (`bus.batches`).
Publishes: `swarm.dlq.ledger` (bad input, original bytes and reason).
Writes: Parquet part files under `<run_dir>/ledger/` (`store.PartWriter`); a message is acked only
after the file holding its row is durable.

Why a restart (even after SIGKILL) neither loses nor duplicates rows: each consumer handles messages
in stream order; each is buffered, or dead-lettered (the DLQ publish confirmed) before the next one
is looked at. Acks are cumulative (`AckPolicy.ALL`, one per flush) and only ever sent for a message
whose predecessors are all written or dead-lettered. So when a flush holding stream sequence N is
durable, every message of that stream up to N is on disk or in the DLQ: the Parquet files, not the
consumer's ack floor, say where the ledger is. On start we read that N per stream
(`views.high_water_marks`) and recreate the durable consumer at N + 1. Merely binding to the old
consumer would not do: the messages the killed process had fetched but not acked stay pending for
`ack_wait_s` and come back only after newer ones, so an episode's events would arrive before its
`begin`. The ordering state is rebuilt from the written events (`views.restore_tracker`), so events
of episodes begun before the restart are still accepted. A flush cut halfway (several tables) is
deleted by `PartWriter.prepare`. A message dead-lettered just before a crash is dead-lettered again
after it; the DLQ publish carries a Nats-Msg-Id, so JetStream drops that copy within its window.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections import Counter
from collections.abc import Callable

import duckdb
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy
from nats.js.errors import NotFoundError

from swarmrl.schemas import WireError
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.tasks import Loops
from swarmrl.services.ledger.columns import TableBuffer
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.ingest import Ingest, Rejected
from swarmrl.services.ledger.sink import StreamSink
from swarmrl.services.ledger.store import PartWriter
from swarmrl.services.ledger.tables import STREAM_TABLES, Row, dead_letter_row
from swarmrl.services.ledger.views import high_water_marks, register_views, restore_tracker

log = logging.getLogger("swarmrl.ledger")
SERVICE = "ledger"
GC_THRESHOLD = 100_000
"""The collector's first threshold while the ledger runs (Python's default is 700); see `run`."""


class Ledger(Loops):
    """The ledger service: `start()`, then `wait()` until `request_stop()`, then `stop()`."""

    def __init__(self, cfg: LedgerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.writer = PartWriter(cfg.run_dir, compression=cfg.compression, fsync=cfg.fsync)
        self.ingest = Ingest(max_event_bytes=cfg.max_event_bytes)
        self.sinks = {stream: StreamSink(stream) for stream in STREAM_TABLES}
        self.counts: Counter[str] = Counter()
        """Rows written per table, plus `redelivered` (late redeliveries, ignored)."""
        self.fetched: Counter[str] = Counter()
        """Messages fetched per stream (redeliveries included), for the final log line."""
        self.nc: NATS | None = None
        self.dlq: bus.DeadLetters | None = None

    async def start(self) -> None:
        removed = await asyncio.to_thread(self.writer.prepare)
        hwm = await asyncio.to_thread(self._recover)
        self.nc = await bus.connect(self.cfg.nats, SERVICE)
        js = self.nc.jetstream()
        await bus.ensure_streams(js)
        self.dlq = bus.DeadLetters(js, SERVICE)
        for stream, sink in self.sinks.items():
            sink.durable_seq = sink.last_seq = hwm.get(stream, 0)
            last = (await js.stream_info(stream)).state.last_seq
            if sink.durable_seq > last:  # rows from another life of the stream: resuming would mix them
                raise RuntimeError(
                    f"{self.writer.root} holds {stream} messages up to seq {sink.durable_seq}, but the stream "
                    f"ends at seq {last}: it was recreated; give this run a fresh --run-dir"
                )
        log.info(
            "ledger writing to %s; resuming after %s; removed %d partial files; %d open episodes",
            self.writer.root,
            {s: k.durable_seq for s, k in self.sinks.items()},
            len(removed),
            len(self.ingest.tracker.open),
        )
        for stream, sink in self.sinks.items():
            durable = S.durable_name(SERVICE, stream)
            try:  # reposition (see the module docstring): the consumer's own position is not the truth
                await js.delete_consumer(stream, durable)
            except NotFoundError:
                pass
            sub = await bus.durable_pull(
                js,
                stream,
                durable,
                ">",  # the whole stream, unfiltered: a filter costs the server a match per message
                ack_wait_s=self.cfg.ack_wait_s,
                max_ack_pending=max(50_000, 2 * (self.cfg.flush_rows + self.cfg.fetch_batch)),
                start_seq=sink.durable_seq + 1,
                ack_policy=AckPolicy.ALL,
                # No byte cap (a fetch is `fetch_batch` messages): a message nats-py dropped as a slow
                # consumer would be acked by the cumulative ack of a later one, and so lost.
                pending_bytes_limit=0,
            )
            self._tasks.append(asyncio.create_task(self._consume(sink, sub), name=f"ledger-{stream}"))
        self._tasks.append(asyncio.create_task(self._log_stats(), name="ledger-stats"))

    def _recover(self) -> dict[str, int]:
        with duckdb.connect() as con:
            register_views(con, self.cfg.run_dir)
            restore_tracker(con, self.ingest.tracker)
            return high_water_marks(con)

    async def stop(self) -> None:
        """Flush what is buffered (then ack it), and disconnect."""
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nc is not None and not self.nc.is_closed:
            # flush, not drain: the acks just sent must reach the server, but draining waits on the
            # pull subscriptions' expired fetch requests for its whole timeout.
            try:
                await self.nc.flush(timeout=5)
            except Exception as exc:  # unacked messages are redelivered and skipped on the next start
                log.warning("final ack flush failed: %r", exc)
            await bus.close(self.nc)
        log.info(
            "ledger stopped: rows %s dead letters %s fetched %s",
            dict(self.counts),
            dict(self.dlq.counts) if self.dlq else {},
            dict(self.fetched),
        )

    async def _consume(self, sink: StreamSink, sub: JetStreamContext.PullSubscription) -> None:
        cfg = self.cfg
        # No poison check (one ack acks every earlier message); after a stop, what the stream held
        # is still recorded (`stop_drain_s`).
        batches = bus.batches(
            sub, self._stop, cfg.fetch_batch, cfg.poll_interval_s, dead_letters=None, drain_s=cfg.stop_drain_s
        )
        async for msgs in batches:
            self.fetched[sink.stream] += len(msgs)
            complete = await self._handle(sink, msgs)
            if sink.due(self.cfg, idle=not msgs):
                await self._start_flush(sink)
            elif sink.writing is not None and sink.writing.done():
                await self._finish_flush(sink)
            await self._ack_settled(sink)
            if not complete:
                break  # stopping while the DLQ is unreachable: the rest is redelivered later
        await self._start_flush(sink)
        await self._finish_flush(sink)
        await self._ack_settled(sink)

    def _ingester(self, stream: str) -> Callable[[Msg, int], tuple[str, Row]]:
        """The function that turns one message of `stream` into its (table, row), or raises why not."""
        ingest = self.ingest
        if stream == S.EPISODES_STREAM:
            return lambda msg, seq: ingest.episode(msg.subject, msg.data, stream, seq, time.time())
        if stream == S.SAMPLES_STREAM:
            return lambda msg, seq: ingest.sample(msg.subject, msg.data, stream, seq)
        if stream == S.METRICS_STREAM:
            return lambda msg, seq: ingest.metric(msg.subject, msg.data, stream, seq)
        return lambda msg, seq: self._dead_letter_row(stream, msg, seq)

    @staticmethod
    def _dead_letter_row(stream: str, msg: Msg, seq: int) -> tuple[str, Row]:
        h = msg.headers or {}
        return "dead_letters", dead_letter_row(
            subject=msg.subject,
            data=msg.data,
            service=h.get(bus.SERVICE_HEADER) or msg.subject.split(".")[-1],
            original_subject=h.get(bus.SUBJECT_HEADER, ""),
            reason=h.get(bus.REASON_HEADER, ""),
            ts=msg.metadata.timestamp.timestamp(),
            stream=stream,
            seq=seq,
        )

    async def _handle(self, sink: StreamSink, msgs: list[Msg]) -> bool:
        """Buffer, skip or dead-letter each message, in order. False: stopped at a message that could
        not be dead-lettered while stopping (it and the rest are left unacked, for redelivery)."""
        ingest = self._ingester(sink.stream)
        for msg in msgs:  # one plain loop: no coroutine per message, awaits only for the rare cases
            seq = msg.metadata.sequence.stream  # nats-py raises NotJSMessageError for a non-JetStream one
            if seq <= sink.last_seq:  # redelivered (its ack was late): already handled, its ack will come
                self.counts["redelivered"] += 1
                if seq <= sink.durable_seq:
                    await self._ack(msg)
                continue
            try:
                table, row = ingest(msg, seq)
            except Exception as exc:  # the one place that decides: any failure to make a row dead-letters it
                if sink.stream == S.DLQ_STREAM:  # never dead-letter a dead letter (it would loop)
                    log.error("unrecordable dead letter subject=%s seq=%d: %r", msg.subject, seq, exc)
                    self.counts["dead_letters_unrecorded"] += 1
                else:
                    reason = str(exc) if isinstance(exc, WireError | Rejected) else f"internal: {exc!r}"
                    if not await self._dead_letter(msg, reason):
                        return False
                sink.last, sink.last_seq = msg, seq
                await self._ack_settled(sink)
                continue
            sink.add(table, row, msg, seq)
        return True

    async def _dead_letter(self, msg: Msg, reason: str) -> bool:
        # Retry until the DLQ takes it: acking without that would drop the message silently, and
        # processing later messages first would break the restart rule above.
        assert self.dlq is not None
        delay = 0.2
        while True:
            try:
                await self.dlq.send(msg, reason)
                return True
            except Exception as exc:
                if self._stop.is_set():
                    return False
                log.error(
                    "dead-letter publish failed subject=%s: %r; retrying in %.1fs", msg.subject, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _start_flush(self, sink: StreamSink) -> None:
        """Write what is buffered in the background while the consumer goes on decoding.

        One write per stream at a time, in order: a later file never lands before an earlier one,
        so the highest sequence on disk always means everything below it is there too.
        """
        await self._finish_flush(sink)
        if not sink.rows:
            return
        buffers, rows = sink.take(self.cfg)
        covering, sink.last = sink.last, None  # this write owns the ack of everything up to it
        sink.writing = asyncio.create_task(self._write(sink, buffers, rows, sink.last_seq, covering))

    async def _finish_flush(self, sink: StreamSink) -> None:
        if sink.writing is not None:
            task, sink.writing = sink.writing, None
            await task  # re-raises what is not an OSError: a bug, which stops the service

    async def _write(
        self,
        sink: StreamSink,
        buffers: dict[str, TableBuffer],
        rows: int,
        top: int,
        covering: Msg | None,
    ) -> None:
        delay = 0.5
        while True:
            try:
                paths = await asyncio.to_thread(self._write_files, buffers)
                break
            except OSError as exc:  # disk full, permissions: keep the messages unacked and retry
                if self._stop.is_set():
                    # Raise, don't return: a later write's cumulative ack would cover these rows too.
                    log.error("flush of %s failed while stopping: %r; JetStream redelivers", sink.stream, exc)
                    raise
                log.error("flush of %s failed: %r; retrying in %.1fs", sink.stream, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        sink.durable_seq = max(sink.durable_seq, top)
        for table, buffer in buffers.items():
            self.counts[table] += buffer.rows
        log.debug("flushed stream=%s rows=%d files=%d up to seq %d", sink.stream, rows, len(paths), top)
        if covering is not None:
            await self._ack(covering)

    def _write_files(self, buffers: dict[str, TableBuffer]) -> list:
        # In a worker thread: Arrow conversion, compression and fsync mostly release the GIL.
        return self.writer.write_group({table: buffer.to_arrow() for table, buffer in buffers.items()})

    async def _ack_settled(self, sink: StreamSink) -> None:
        """Ack the latest handled message if nothing below it waits for a write (dead letters only)."""
        if sink.last is not None and not sink.rows and sink.writing is None:
            sink.durable_seq = sink.last_seq
            msg, sink.last = sink.last, None
            await self._ack(msg)

    async def _ack(self, msg: Msg) -> None:
        try:
            await msg.ack()
        except Exception as exc:  # a lost ack only means a redelivery, which durable_seq skips
            log.debug("ack failed subject=%s: %r", msg.subject, exc)

    async def _log_stats(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.cfg.stats_interval_s)
            except TimeoutError:
                pass
            assert self.dlq is not None
            # Vanished clients' episodes: the ordering state stays bounded by the tracker's max_closed.
            forgotten = self.ingest.tracker.expire(time.time(), self.cfg.open_episode_ttl_s)
            self.counts["forgotten_open_episodes"] += len(forgotten)
            log.info(
                "rows %s dead letters %s open episodes %d",
                dict(self.counts),
                dict(self.dlq.counts),
                len(self.ingest.tracker.open),
            )


def lower_priority(nice: int) -> int | None:
    """Lower this thread's CPU priority to niceness `nice` (never raise it); return the niceness now
    (None where the platform has no niceness). Call it before any thread is started: on Linux the
    niceness is per thread, and threads inherit it from the one that starts them."""
    if not hasattr(os, "setpriority"):
        return None
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    return os.getpriority(os.PRIO_PROCESS, 0)


async def run(cfg: LedgerConfig) -> None:
    """Run the ledger until SIGINT/SIGTERM."""
    import signal

    log.info("ledger at niceness %s", lower_priority(cfg.nice))  # before the writer threads start
    ledger = Ledger(cfg)
    await ledger.start()
    # What start loaded (pyarrow, duckdb, nats) lives as long as the process: keep it out of the
    # collector's full passes, which otherwise walk it again every few thousand messages.
    gc.freeze()
    # Each buffered row is a dict (with arrays, for an llm call) that lives until its flush, about two
    # container objects per message. At the default threshold (700 more of them alive than freed) the
    # collector ran every ~300 messages and walked the buffered rows again each time, finding nothing
    # to free: ~10% of the ledger's CPU. A flush frees its rows, so above what one flush holds the
    # collector runs only when objects really pile up.
    threshold = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *threshold[1:])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, ledger.request_stop)
    try:
        await ledger.wait()
    finally:
        await ledger.stop()
        gc.set_threshold(*threshold)
        gc.unfreeze()  # frozen objects are never freed: nanobind (duckdb) would report them as leaks
