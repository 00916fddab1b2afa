"""NATS side of the ledger: one durable pull consumer per stream, each a `Recorder` (`recorder.py`).

Consumes: EPISODES (replicas: LEDGER_PARTS), SAMPLES, METRICS and DLQ, each with its durable consumer
`ledger-<stream>`. Publishes: `swarm.dlq.ledger`. Writes: Parquet part files under
`<run_dir>/ledger/`; a message is acked only after the file holding its row is durable.

Why a restart (even after SIGKILL) neither loses nor duplicates rows: messages are handled in stream
order, each buffered or dead-lettered before the next, and a cumulative ack (`AckPolicy.ALL`) is
only sent for a message whose predecessors are all written or dead-lettered. So the Parquet files,
not the consumer's ack floor, say where the ledger is: on start the highest sequence per stream
(`views.high_water_marks`) is read and the durable consumer recreated right after it (binding to the
old one would replay the killed process's unacked messages after newer ones). The ordering state is
rebuilt from the written events (`views.restore_tracker`). A repeated dead letter carries a
Nats-Msg-Id, so JetStream drops the copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import duckdb
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.leases import LeasedWork, Leases, take_consumer
from swarmrl.services.common.lifecycle import EpisodeTracker
from swarmrl.services.common.retry import TRANSIENT
from swarmrl.services.common.tasks import Loops, on_signals, wait_set
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.ingest import Ingest
from swarmrl.services.ledger.recorder import Recorder, StreamSink
from swarmrl.services.ledger.remote import serve_queries
from swarmrl.services.ledger.store import Fenced, PartWriter
from swarmrl.services.ledger.tables import STREAM_TABLES
from swarmrl.services.ledger.views import high_water_marks, register_views, restore_tracker

log = logging.getLogger("swarmrl.ledger")
SERVICE = "ledger"
GC_THRESHOLD = 100_000
"""The collector's first threshold while the ledger runs (Python's default is 700)."""


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
        self._takeovers = itertools.count()
        self.partition_ingests: dict[int, Ingest] = {}
        """Replicas: each partition's own ingest (its episodes' ordering state)."""

    async def start(self) -> None:
        self.nc = await bus.connect(self.cfg.nats, SERVICE)
        js = self.nc.jetstream()
        await bus.ensure_streams(js)
        self.dlq = bus.DeadLetters(self.nc, SERVICE)
        try:
            await js.stream_info(S.LEDGER_PARTS_STREAM)
            replicas_here = True
        except NotFoundError:
            replicas_here = False
        if self.cfg.replica:  # one of several: what it writes follows its leases
            if not replicas_here:
                raise RuntimeError(
                    f"ledger replica {self.cfg.replica!r}: stream {S.LEDGER_PARTS_STREAM} is missing; the "
                    "operator creates it (`swarmrl up` with `[replicas] ledger` > 1)"
                )
            self._tasks.append(asyncio.create_task(self._replica(js), name="ledger-leases"))
        elif replicas_here:  # a lone ledger beside replicas would record everything a second time
            raise RuntimeError(
                f"this swarm's ledgers are replicas ({S.LEDGER_PARTS_STREAM} exists): start this one "
                "with --replica NAME"
            )
        else:
            self._tasks += await self._start_streams(js, list(self.sinks), self._stop)
        self._tasks.append(asyncio.create_task(self._log_stats(), name="ledger-stats"))

    async def _start_streams(
        self,
        js: JetStreamContext,
        streams: list[str],
        stop: asyncio.Event,
        owned: Callable[[], bool] | None = None,
    ) -> list[asyncio.Task[None]]:
        """Consume `streams` from where the files end, until `stop`; `owned`: a replica's lease on them."""
        if owned is not None:
            for stream in streams:
                self.sinks[stream] = StreamSink(stream, owned=owned)
        removed = await asyncio.to_thread(self.writer.prepare)
        tracker = self.ingest.tracker if S.EPISODES_STREAM in streams else None
        hwm = await asyncio.to_thread(self._recover, tracker)
        subs = {}
        for stream in streams:
            sink = self.sinks[stream]
            sink.durable_seq = sink.last_seq = hwm.get(stream, 0)
            # Unfiltered (a filter costs the server a match per message); no byte cap: a message
            # nats-py dropped as a slow consumer would be acked by a later cumulative ack, and lost.
            subs[stream] = await bus.resume_durable(
                js, stream, S.durable_name(SERVICE, stream), sink.durable_seq, self.writer.root,
                ack_wait_s=self.cfg.ack_wait_s, max_ack_pending=self._max_ack_pending, pending_bytes_limit=0,
            )  # fmt: skip
        resumed = {s: self.sinks[s].durable_seq for s in streams}
        log.info(
            "ledger writing to %s; resuming after %s; removed %d partial files; %d open episodes",
            self.writer.root, resumed, len(removed), len(self.ingest.tracker.open),
        )  # fmt: skip
        return [
            asyncio.create_task(
                Recorder(self, self.sinks[s], sub, stop, self.ingest, self.writer).run(), name=f"ledger-{s}"
            )
            for s, sub in subs.items()
        ]

    @property
    def _max_ack_pending(self) -> int:
        return max(50_000, 2 * (self.cfg.flush_rows + self.cfg.fetch_batch))

    def _recover(self, tracker: EpisodeTracker | None, sub: str = "") -> dict[str, int]:
        """High-water marks of what is on disk (of partition folder `sub` only, if given), and the
        ordering state of its episodes restored into `tracker`."""
        with duckdb.connect() as con:
            register_views(con, self.cfg.run_dir, sub)
            if tracker is not None:
                restore_tracker(con, tracker)
            return high_water_marks(con)

    # Replicas: leases 0..15 are the episode partitions of LEDGER_PARTS, lease 16 the other streams.
    # A partition's owner writes under `<table>/p<partition>/` with EPISODES' own sequence numbers
    # (`bus.source_seq`). LEDGER_PARTS is a work queue: a new owner starts a fresh consumer, which
    # delivers every unacked message in order, and skips those its files already hold.

    async def _replica(self, js: JetStreamContext) -> None:
        kv = await js.key_value(S.LEASES_BUCKET)
        leases = Leases(js, kv, SERVICE, self.cfg.replica, S.EPISODE_PARTITIONS + 1)
        log.info(
            "replica %s consuming %s and the other streams by lease", self.cfg.replica, S.LEDGER_PARTS_STREAM
        )
        # Fenced, or a NATS call timed out: the partition's next round starts afresh, if still ours.
        # Anything else fails as a crash would.
        work = LeasedWork(leases, partial(self._own, js), margin_s=1.0, survive=(Fenced, *TRANSIENT))
        try:
            while not self._stop.is_set():
                await work.tick()
                await wait_set(self._stop, self.cfg.lease_interval_s)
        finally:
            await work.stop()
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await asyncio.wait_for(leases.leave(), timeout=10)

    async def _own(
        self, js: JetStreamContext, p: int, stop: asyncio.Event, owned: Callable[[], bool]
    ) -> None:
        """Record lease `p` until `stop`: an episode partition, or (the last) the other streams."""
        if p == S.EPISODE_PARTITIONS:
            streams = [s for s in self.sinks if s != S.EPISODES_STREAM]
            tasks = await self._start_streams(js, streams, stop, owned)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            stop.set()  # one failed (fenced, or worse): the others stop with it
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                task.result()
            return
        writer = PartWriter(
            self.cfg.run_dir, compression=self.cfg.compression, fsync=self.cfg.fsync, sub=f"p{p}"
        )
        await asyncio.to_thread(writer.prepare)
        # Its own ordering state, from its files alone: what an earlier ownership held unwritten
        # must not count as seen.
        ingest = self.partition_ingests[p] = Ingest(max_event_bytes=self.cfg.max_event_bytes)
        hwm = (await asyncio.to_thread(self._recover, ingest.tracker, writer.sub)).get(S.EPISODES_STREAM, 0)
        sink = StreamSink(S.EPISODES_STREAM, sourced=True, owned=owned)
        sink.durable_seq = sink.last_seq = hwm
        # a fresh consumer per takeover, its name new: a stalled earlier run here must never read from it
        prefix = f"ledger-p{p}-"
        sub, _ = await take_consumer(
            js, S.LEDGER_PARTS_STREAM, prefix, f"{prefix}{self.cfg.replica}-{next(self._takeovers)}",
            S.partition_filter(p, S.LEDGER_PARTITION_PREFIX), ack_wait_s=self.cfg.ack_wait_s,
            max_ack_pending=self._max_ack_pending, pending_bytes_limit=0,
        )  # fmt: skip
        log.info("partition %d: resuming after EPISODES seq %d", p, hwm)
        try:
            await Recorder(self, sink, sub, stop, ingest, writer).run()
        finally:
            self.partition_ingests.pop(p, None)
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def stop(self) -> None:
        """Flush what is buffered (then ack it), and disconnect."""
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nc is not None:  # unacked messages come back, skipped at restart
            await bus.close(self.nc, flush_s=5)
        dead = dict(self.dlq.counts) if self.dlq else {}
        log.info(
            "ledger stopped: rows %s dead letters %s fetched %s", dict(self.counts), dead, dict(self.fetched)
        )

    async def _log_stats(self) -> None:
        while not self._stop.is_set():
            await wait_set(self._stop, self.cfg.stats_interval_s)
            assert self.dlq is not None
            ingests = [self.ingest, *self.partition_ingests.values()]
            for ingest in ingests:
                forgotten = ingest.tracker.expire(time.time(), self.cfg.open_episode_ttl_s)
                self.counts["forgotten_open_episodes"] += len(forgotten)
            opened = sum(len(i.tracker.open) for i in ingests)
            log.info(
                "rows %s dead letters %s open episodes %d", dict(self.counts), dict(self.dlq.counts), opened
            )


def lower_priority(nice: int) -> int | None:
    """Lower this thread's CPU priority to niceness `nice` (never raise it); return the niceness now
    (None without niceness). Call it before any thread starts: on Linux threads inherit it."""
    if not hasattr(os, "setpriority"):
        return None
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    return os.getpriority(os.PRIO_PROCESS, 0)


async def run(cfg: LedgerConfig) -> None:
    """Run the ledger until SIGINT/SIGTERM."""
    log.info("ledger at niceness %s", lower_priority(cfg.nice))  # before the writer threads start
    ledger = Ledger(cfg)
    await ledger.start()
    assert ledger.nc is not None
    queries = await serve_queries(ledger.nc, cfg.run_dir)  # SQL over NATS (`swarmrl query --remote`)
    # What start loaded lives as long as the process: keep it out of the collector's full passes.
    gc.freeze()
    # Buffered rows live until their flush: at the default threshold the collector kept walking them.
    threshold = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *threshold[1:])
    on_signals(ledger.request_stop)
    try:
        await ledger.wait()
    finally:
        try:
            await queries.stop()
        except Exception as exc:  # the connection may be gone already: the ledger's stop goes on
            log.warning("query service stopped with an error: %r", exc)
        await ledger.stop()
        gc.set_threshold(*threshold)
        gc.unfreeze()  # frozen objects are never freed: nanobind (duckdb) would report them as leaks
