"""The merger: hold each episode's events, merge at `end`, publish, then ack.

Consumes: EPISODE_PARTS (`swarm.epp.<partition>.<owner>.<episode_id>.<kind>`: EPISODES, partitioned by
episode by JetStream itself, `schemas/subjects.py`), one durable pull consumer
`merger-p<partition>-<replica>` per partition this replica holds the lease of (`partition.py`).
Publishes: `swarm.samples.<model>` (one `Sample` per surviving timeline, Nats-Msg-Id = sample_id),
`swarm.samples.<model>.lost` (one `LostEpisode` per trainable model a training episode sends no
sample, Nats-Msg-Id = `lost-<episode_id>-<model>`: its trainer counts it out of its group),
`swarm.metrics.merge` (one `MergeStats` per episode, Nats-Msg-Id = `merge-<episode_id>`),
`swarm.dlq.merger` (bad input with the original bytes and the reason).

Replicas. Any number of mergers (`[replicas] merger = N`, or `swarmrl serve merger` on more machines)
share the partitions through leases in NATS KV (`common/leases.py`): each takes its fair share, a new
one makes the others give some back, a dead one's partitions are taken over once its leases expire
(`bus.LEASE_TTL_S`). Every event of an episode is in one partition, so one merger sees all of it.

Taking a partition over, a merger deletes the partition's consumers and creates its own. EPISODE_PARTS
is a work queue: an acked event is gone from it, so the new consumer delivers, at once and in stream
order, exactly the events nobody has acked: those of every episode still open when the last owner
stopped or died. No wait for the old owner's ack wait, and no begin after its own episode's later
events. The one other thing it can deliver is what the old owner left of an episode it closed: the
owner acks an episode's begin first, so events it died before acking (or whose acks a broker node
lost) come without their begin; they are acked and counted (`replayed_leftovers`).

Ack discipline: the events of an open episode stay unacked (kept alive with in-progress acks). At
`end` the samples and the stats are published, each confirmed by JetStream, and only then are the
episode's events acked; `abort` or `episode_timeout_s` without events publishes stats and acks. A
merger killed at any point leaves every unfinished episode unacked, the partition's next owner
replays it, and the republished samples carry the same msg ids, which the duplicate window on SAMPLES
(`bus.SERVICE_DUPLICATE_WINDOW_S`, 30 min) drops: nothing lost, nothing doubled.

All or none across models: an episode's samples for several models (`swarm.samples.<model>`) cannot
be stored atomically, so the guarantee is about what the streams end up holding. Ended and merged:
every model's samples and the stats are published concurrently, each confirmed, before the first of
its events is acked. A failure before the first publish (undecodable calls, a merge error, a sample
over the size limit) drops the episode whole (stats `aborted`, dead letter, no sample for any model);
from the first publish on a failure is never turned into a drop: it propagates out of `run()` with
the episode unacked, like a crash. Aborted or timed out: stats and a `LostEpisode` per model. A
merger that dies between two models' publishes leaves the episode unacked; the partition's next owner
merges the same events into the same samples with the same ids and publishes all of them again: the
duplicate window drops the copies already stored, the missing ones land. (Between the crash and the
replay one model's stream may hold its samples while another's does not yet; a replay later than the
duplicate window after the first publish stores the surviving copies a second time.)
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
from swarmrl.services.merger.config import MergerConfig
from swarmrl.services.merger.inflight import Held, OpenEpisode, RecentAcks
from swarmrl.services.merger.partition import Partition

log = logging.getLogger("swarmrl.merger")
SERVICE = "merger"
CLOSED_KEEP_S = 600.0
"""How long a replica remembers the episodes it closed: a partition it takes back within this time
acks their replayed events instead of dead-lettering them as unknown (`Partition._accept`)."""


class Merger:
    """The merger service (one replica): `await run()` until `request_stop()`. Works on the partitions
    it holds the leases of, one `Partition` each (`LeasedWork`)."""

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
        """The open episodes of every partition held."""
        return {eid: ep for part in self.partitions.values() for eid, ep in part.episodes.items()}

    @property
    def held(self) -> dict[tuple[int, int], Held]:
        """The unacked events held, by (partition, stream sequence)."""
        return {(p, seq): h for p, part in self.partitions.items() for seq, h in part.inflight.held.items()}

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Renew the leases and keep one `Partition` at work per partition held, until stopped; then
        hand the unfinished work back (the partitions' next owners replay it) and leave."""
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
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=self.cfg.lease_interval_s)
        except Stopping:
            pass
        finally:
            await self._leave(nc)

    async def _partition(self, p: int, stop: asyncio.Event, owned: Callable[[], bool]) -> None:
        """The work of partition `p` while it is ours (`LeasedWork`)."""
        assert self.js is not None and self.dlq is not None, "run() connects first"
        part = self.partitions[p] = Partition(self, p, self.js, self.dlq, stop, owned)
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
        if not nc.is_closed:
            # flush, not drain: the acks and naks must reach the server, but draining waits on the
            # pull subscriptions' expired fetch requests for their whole timeout.
            try:
                await nc.flush(timeout=5)
            except (nats.errors.Error, TimeoutError) as exc:  # what did not reach the server comes back
                log.warning("final flush failed: %r", exc)
            await bus.close(nc)

    def log_stats(self) -> None:
        dead = dict(self.dlq.counts) if self.dlq else {}
        log.info(
            "counters: merged=%d empty=%d eval=%d aborted=%d timeout=%d samples=%d dead_letters=%d %s "
            "partitions=%d open=%d held=%d",
            self.counts["merged"], self.counts["empty"], self.counts["eval"], self.counts["aborted"],
            self.counts["timeout"], self.counts["samples"], sum(dead.values()), dead, len(self.partitions),
            len(self.episodes), len(self.held),
        )  # fmt: skip

    async def publish(self, subject: str, data: bytes, msg_id: str) -> None:
        """Publish with a msg id, through broker hiccups (returns once JetStream confirmed it)."""
        assert self.js is not None, "run() connects first"
        await retry(self._stop, self.js.publish, subject, data, headers={"Nats-Msg-Id": msg_id})
