"""NATS side of the tracker: export every metric of the swarm to TensorBoard, W&B and MLflow.

Consumes: METRICS with the durable pull consumer `tracker-metrics`, in stream order.
Publishes: `swarm.dlq.tracker` (a metric that does not decode). Writes: `<run_dir>/track/`.

Each fetched batch becomes rows (`rows.RowMaker`), is written and flushed to every tracker, then
the position is saved and the batch acked (one cumulative ack). As in the ledger, the saved position
says where the export is: at start the consumer is recreated right after it, so a restart goes on
in stream order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from swarmrl.schemas import WireError, decode_metric
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.tasks import Loops, serve_until_signalled, wait_set
from swarmrl.services.tracker.backends import Backend, open_backends
from swarmrl.services.tracker.config import TrackerConfig
from swarmrl.services.tracker.rows import Row, RowMaker
from swarmrl.services.tracker.state import TrackState

log = logging.getLogger("swarmrl.tracker")
SERVICE = "tracker"


class Tracker(Loops):
    """The exporter: `start()`, then `wait()` until `request_stop()`, then `stop()`."""

    def __init__(self, cfg: TrackerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.state_path = cfg.track_dir() / "state.json"
        self.state = TrackState.load(self.state_path)
        self.maker = RowMaker(counts=Counter(self.state.counts))
        self.backends: list[Backend] = []
        self.counts: Counter[str] = Counter()
        """Records and values exported, for the log."""
        self.nc: NATS | None = None
        self.dlq: bus.DeadLetters | None = None

    async def start(self) -> None:
        # Before connecting: the libraries take seconds to import and open (nothing waits on us yet).
        self.backends = open_backends(self.cfg, self.state.run_ids)
        self.state.run_ids = {b.name: b.run_id for b in self.backends if b.run_id}
        self.nc = await bus.connect(self.cfg.nats, SERVICE)
        js = self.nc.jetstream()
        await bus.ensure_streams(js)
        self.dlq = bus.DeadLetters(self.nc, SERVICE)
        sub = await bus.resume_durable(
            js, S.METRICS_STREAM, S.durable_name(SERVICE, S.METRICS_STREAM), self.state.seq, self.state_path,
            ack_wait_s=self.cfg.ack_wait_s,
        )  # fmt: skip
        log.info(
            "exporting %s to %s from seq %d (runs %s)",
            S.METRICS_STREAM, ", ".join(self.cfg.track), self.state.seq + 1, self.state.run_ids,
        )  # fmt: skip
        self._tasks = [
            asyncio.create_task(self._consume(sub), name="tracker-consume"),
            asyncio.create_task(self._log_stats(), name="tracker-stats"),
        ]

    async def stop(self) -> None:
        """Finish what was fetched, close the trackers' runs, disconnect."""
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for backend in self.backends:
            await asyncio.to_thread(backend.close)
        if self.nc is not None:  # the last ack must reach the server; a lost one means a skipped redelivery
            await bus.close(self.nc, flush_s=5)
        log.info("tracker stopped at seq %d: %s", self.state.seq, dict(self.counts))

    async def _consume(self, sub: JetStreamContext.PullSubscription) -> None:
        cfg = self.cfg
        async for msgs in bus.batches(
            sub, self._stop, cfg.fetch_batch, cfg.poll_interval_s, dead_letters=None, drain_s=cfg.stop_drain_s
        ):
            if msgs:
                await self._export(msgs)

    async def _export(self, msgs: list[Msg]) -> None:
        """Rows of `msgs` to every tracker, then the position saved, then one ack for them all."""
        rows: list[Row] = []
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq <= self.state.seq:  # a late redelivery of something already exported
                continue
            try:
                record = decode_metric(msg.subject, msg.data)
            except Exception as exc:  # the one place that decides: what does not decode is dead-lettered
                assert self.dlq is not None
                reason = str(exc) if isinstance(exc, WireError) else f"internal: {exc!r}"
                await self.dlq.send(msg, reason)  # a failure ends the service; the restart redoes it
            else:
                rows += self.maker.rows(record)
                self.counts[type(record).__name__] += 1
            self.state.seq = seq
        await asyncio.to_thread(self._write, rows)
        self.state.counts = Counter(self.maker.counts)
        await asyncio.to_thread(self.state.save, self.state_path)
        try:
            await msgs[-1].ack()
        except Exception as exc:  # the next start goes on from the saved position anyway
            log.debug("ack failed subject=%s: %r", msgs[-1].subject, exc)

    def _write(self, rows: list[Row]) -> None:
        for backend in self.backends:
            backend.write(rows)
            backend.flush()
        self.counts["values"] += sum(len(row.values) for row in rows)

    async def _log_stats(self) -> None:
        while not await wait_set(self._stop, self.cfg.stats_interval_s):
            log.info("exported up to seq %d: %s", self.state.seq, dict(self.counts))


async def run(cfg: TrackerConfig) -> None:
    """Run the exporter until SIGINT/SIGTERM."""
    await serve_until_signalled(Tracker(cfg))
