"""The merger: hold each episode's events, merge at `end`, publish, then ack.

Consumes: EPISODE_PARTS (EPISODES partitioned by episode, `schemas/subjects.py`), one pull consumer
`merger-p<partition>-<replica>` per partition this replica holds the lease of (`partition.py`).
Publishes (Nats-Msg-Id in brackets): `swarm.samples.<model>` (one `Sample` per surviving timeline
[sample_id]), `swarm.samples.<model>.lost` (a `LostEpisode` per trainable model an episode sends no
sample [`lost-<episode_id>-<model>`]), `swarm.metrics.merge` (a `MergeStats` per episode
[`merge-<episode_id>`]), `swarm.dlq.merger`.

Replicas share the partitions through leases in NATS KV (`common/leases.py`). Taking a partition
over, a merger replaces its consumer: EPISODE_PARTS is a work queue, so the new one delivers at once,
in stream order, exactly the unacked events: those of every episode still open. An episode's begin
is acked first, so what an old owner left of an episode it closed comes without its begin and is
acked as `replayed_leftovers`.

Ack discipline: an open episode's events stay unacked (kept alive). At `end` every model's samples
and the stats are published, each confirmed, before its events are acked. A failure before the
first publish drops the episode whole (stats `aborted`, a dead letter); from the first publish on it
propagates like a crash, leaving the episode unacked. The next owner replays it into the same
samples with the same msg ids, which the SAMPLES duplicate window drops: nothing lost or doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.leases import LeasedWork, Leases
from swarmrl.services.common.retry import Stopping, retry
from swarmrl.services.common.tasks import wait_set
from swarmrl.services.merger.config import MergerConfig
from swarmrl.services.merger.inflight import Held, OpenEpisode, RecentAcks
from swarmrl.services.merger.partition import Partition

log = logging.getLogger("swarmrl.merger")
SERVICE = "merger"
CLOSED_KEEP_S = 600.0
"""How long a replica remembers the episodes it closed, to ack their replayed events (`Partition._accept`)."""


class Merger:
    """One merger replica: `await run()` until `request_stop()`; one `Partition` per lease held."""

    def __init__(self, cfg: MergerConfig) -> None:
        self.cfg = cfg
        self.replica = (
            cfg.replica or f"{S.owner_name(socket.gethostname())}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.counts: Counter[str] = Counter()
        """merged, empty, eval, aborted, timeout, samples, redelivered, ..."""
        self.js: JetStreamContext | None = None
        self.dlq: bus.DeadLetters | None = None
        self.work: LeasedWork | None = None
        self.partitions: dict[int, Partition] = {}
        """The partitions at work (stopping ones included, until their work has ended)."""
        self.closed: RecentAcks[str] = RecentAcks(keep_s=CLOSED_KEEP_S)
        """Episodes this process closed lately (published, then acked), by id."""
        self.max_payload = 1 << 20
        """Largest sample message (headers included) the server and the SAMPLES stream accept."""
        self._stop = asyncio.Event()

    @property
    def episodes(self) -> dict[str, OpenEpisode]:
        return {eid: ep for part in self.partitions.values() for eid, ep in part.episodes.items()}

    @property
    def held(self) -> dict[tuple[int, int], Held]:
        """The unacked events held, by (partition, stream sequence)."""
        return {(p, seq): h for p, part in self.partitions.items() for seq, h in part.inflight.held.items()}

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Renew the leases and work the partitions held until stopped; then hand unfinished work back."""
        nc = await bus.connect(self.cfg.nats, SERVICE)
        try:
            self.js = js = nc.jetstream()
            await bus.ensure_streams(js)
            stream_max = (await js.stream_info(S.SAMPLES_STREAM)).config.max_msg_size or -1
            self.max_payload = min(nc.max_payload, stream_max) if stream_max > 0 else nc.max_payload
            self.dlq = bus.DeadLetters(nc, SERVICE)
            leases = Leases(
                js, await js.key_value(S.LEASES_BUCKET), SERVICE, self.replica, S.EPISODE_PARTITIONS
            )
            self.work = work = LeasedWork(leases, self._partition, margin_s=self.cfg.lease_interval_s)
            log.info("replica %s consuming %s (merge=%s mode=%s)", self.replica, S.EPISODE_PARTS_STREAM,
                     self.cfg.merge, self.cfg.merge_mode)  # fmt: skip
            last_stats = time.monotonic()
            while not self._stop.is_set():
                await work.tick()
                if time.monotonic() - last_stats > self.cfg.stats_interval_s:
                    last_stats = time.monotonic()
                    self.log_stats()
                await wait_set(self._stop, self.cfg.lease_interval_s)
        except Stopping:
            pass
        finally:
            await self._leave(nc)

    async def _partition(self, p: int, stop: asyncio.Event, owned: Callable[[], bool]) -> None:
        """The work of partition `p` while it is ours (`LeasedWork`)."""
        part = self.partitions[p] = Partition(self, p, stop, owned)
        try:
            await part.run()
        finally:
            del self.partitions[p]

    async def _leave(self, nc: NATS) -> None:
        """Hand unfinished work back now (the naks first, then the leases: successors replay at once)."""
        if (work := self.work) is not None:
            await work.stop(timeout=30)
            if not nc.is_closed:
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await nc.flush(timeout=5)
                    await asyncio.wait_for(work.leases.leave(), timeout=10)
        self.log_stats()
        await bus.close(nc, flush_s=5)

    def log_stats(self) -> None:
        dead = dict(self.dlq.counts) if self.dlq else {}
        counts = " ".join(
            f"{k}={self.counts[k]}" for k in ("merged", "empty", "eval", "aborted", "timeout", "samples")
        )
        log.info("counters: %s dead_letters=%d %s partitions=%d open=%d held=%d", counts, sum(dead.values()), dead,
                 len(self.partitions), len(self.episodes), len(self.held))  # fmt: skip

    async def publish(self, subject: str, data: bytes, msg_id: str) -> None:
        """Publish with a msg id, through broker hiccups (returns once JetStream confirmed it)."""
        assert self.js is not None, "run() connects first"
        await retry(self._stop, self.js.publish, subject, data, headers={"Nats-Msg-Id": msg_id})
