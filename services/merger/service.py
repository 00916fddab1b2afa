"""NATS side of the merger: hold each episode's events, merge at `end`, publish, then ack.

Consumes: EPISODE_PARTS (`swarm.epp.<partition>.<owner>.<episode_id>.<kind>`: EPISODES, partitioned by
episode by JetStream itself, `schemas/subjects.py`), one durable pull consumer
`merger-p<partition>-<replica>` per partition this replica holds the lease of
(`services/common/leases.py`).
Publishes: `swarm.samples.<model>` (one `Sample` per surviving timeline, Nats-Msg-Id = sample_id),
`swarm.samples.<model>.lost` (one `LostEpisode` per trainable model a training episode sends no
sample, Nats-Msg-Id = `lost-<episode_id>-<model>`: its trainer counts it out of its group),
`swarm.metrics.merge` (one `MergeStats` per episode, Nats-Msg-Id = `merge-<episode_id>`),
`swarm.dlq.merger` (bad input with the original bytes and the reason).

Replicas. Any number of mergers (`[replicas] merger = N`, or `swarmrl serve merger` on more machines)
share the partitions through leases in NATS KV: each takes its fair share, a new one makes the others
give some back, a dead one's partitions are taken over once its leases expire (`bus.LEASE_TTL_S`).
Every event of an episode is in one partition, so one merger sees all of it.

Taking a partition over, a merger deletes the partition's consumers and creates its own. EPISODE_PARTS is a work
queue: an acked event is gone from it, so the new consumer delivers, at once and in stream order,
exactly the events nobody has acked, which are those of every episode still open when the last owner
stopped or died. No wait for the old owner's ack wait, and no begin arriving after its own episode's
later events. The one other thing it can deliver is what the old owner left of an episode it closed:
the owner acks an episode's begin first, so events it died before acking (or whose acks a broker
node lost) come without their begin; they are acked and counted (`replayed_leftovers`), not
dead-lettered as `unknown_episode`.

One consumer can deliver an episode's begin after its later events too: a delivery lost in flight
with a broker node comes back only after the ack wait, behind whatever was delivered since. So an
event of an episode whose begin has not come is parked (kept unacked and alive, counted `parked`)
for two ack waits; if its begin comes, the parked events follow it in stream order (`unparked`),
else they are dead-lettered as `unknown_episode`.

Ack discipline: the events of an open episode stay unacked (kept alive with in-progress acks). At
`end` the samples and the stats are published, each confirmed by JetStream, and only then are the
episode's events acked; `abort` or `episode_timeout_s` without events publishes stats and acks. A
merger killed at any point therefore leaves every unfinished episode unacked, the partition's next
owner replays it, and republished samples carry the same msg ids, so
JetStream's duplicate window on SAMPLES (`bus.SERVICE_DUPLICATE_WINDOW_S`, 30 min) drops them:
nothing lost, nothing doubled.

All or none across models. An episode whose agents call several trainable models has samples on
several subjects (`swarm.samples.<model>`); JetStream cannot store them atomically, so the guarantee
is about what the streams end up holding, not about what a trainer may see in between:

- Ended and merged: the samples of every model and the stats are published concurrently, each with a
  deterministic msg id (`<episode_id>.<agent>.<model>.<index>`, `merge-<episode_id>`) and each
  confirmed by JetStream, before the first of the episode's events is acked. No path acks an
  episode that has published a subset: a failure before the first publish (undecodable calls, a
  merge error, a sample over the size limit) drops the episode whole (stats `aborted`, dead letter,
  no samples for any model); a failure from the first publish on is never turned into a drop (part
  of the samples may be stored): it propagates out of `run()` with the episode unacked, like a crash.
- Aborted or timed out: stats and a `LostEpisode` per model, no sample for any model.
- A merger that dies (or fails) between two models' publishes leaves the episode unacked. Whoever
  owns the partition next replays it in stream order, merges the same events into the same
  samples with the same ids, and publishes every one of them again: the duplicate window drops the
  copies already stored, the missing ones land. Each model's stream then holds exactly one copy of
  each of the episode's samples. Between the crash and the replay one model's stream may hold its
  samples while another's does not yet; if the replay comes later than the duplicate window after
  the first publish, the copies already stored land a second time.
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
from collections.abc import Awaitable, Callable
from functools import partial
from typing import cast

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import (
    BeginEvent,
    LlmEvent,
    MergeStats,
    RewardEvent,
    WireError,
    decode_event,
    encode,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.leases import Leases
from swarmrl.services.common.lifecycle import EpisodeTracker, check_subject
from swarmrl.services.common.retry import Stopping, retry
from swarmrl.services.merger.assembler import assemble, dropped_stats, lost_episodes
from swarmrl.services.merger.config import MergerConfig
from swarmrl.services.merger.inflight import Held, OpenEpisode, Parked, RecentAcks

log = logging.getLogger("swarmrl.merger")
SERVICE = "merger"
CLOSED_KEEP_S = 600.0
"""How long a replica remembers the episodes it closed: a partition it takes back within this time
acks their replayed events instead of dead-lettering them as unknown (`Partition._accept`)."""
HEADER_MARGIN = 64
"""Bytes of a sample's headers besides its msg id (`NATS/1.0`, `Nats-Msg-Id: `, line ends)."""


class Merger:
    """The merger service (one replica): `await run()` until `request_stop()`. Works on the partitions
    it holds the leases of, one `Partition` each."""

    def __init__(self, cfg: MergerConfig) -> None:
        self.cfg = cfg
        self.replica = (
            cfg.replica or f"{S.owner_name(socket.gethostname())}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.counts: Counter[str] = Counter()
        """merged, empty, eval, aborted, timeout, samples, redelivered, ..."""
        self.dlq: bus.DeadLetters | None = None
        self.partitions: dict[int, Partition] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._stopping: dict[int, asyncio.Task[None]] = {}
        """Partitions asked to stop (lease lost, given back or fenced) whose work has not ended yet."""
        self._releasing: set[int] = set()
        """Partitions to give back once their work has stopped."""
        self._renewed = time.monotonic()
        """When the leases were last renewed."""
        self.closed: RecentAcks[str] = RecentAcks(keep_s=CLOSED_KEEP_S)
        """Episodes this process closed lately (published, then acked), by id."""
        self._js: JetStreamContext | None = None
        self._max_payload = 1 << 20
        """Largest sample message (headers included) the server and the SAMPLES stream accept."""
        self._stop = asyncio.Event()
        self._last_stats = time.monotonic()

    @property
    def episodes(self) -> dict[str, OpenEpisode]:
        """The open episodes of every partition held."""
        return {eid: ep for part in self.partitions.values() for eid, ep in part.episodes.items()}

    @property
    def held(self) -> dict[tuple[int, int], Held]:
        """The unacked events held, by (partition, stream sequence)."""
        return {(p, seq): h for p, part in self.partitions.items() for seq, h in part.held.items()}

    def request_stop(self) -> None:
        self._stop.set()

    def leased(self) -> bool:
        """Were the leases renewed recently enough that no other replica can have taken ours?"""
        return time.monotonic() - self._renewed < bus.LEASE_TTL_S - self.cfg.lease_interval_s

    async def run(self) -> None:
        nc = await bus.connect(self.cfg.nats, SERVICE)
        leases: Leases | None = None
        try:
            self._js = js = nc.jetstream()
            await bus.ensure_streams(js)
            stream_max = (await js.stream_info(S.SAMPLES_STREAM)).config.max_msg_size or -1
            self._max_payload = min(nc.max_payload, stream_max) if stream_max > 0 else nc.max_payload
            self.dlq = bus.DeadLetters(nc, SERVICE)
            kv = await js.key_value(S.LEASES_BUCKET)
            leases = Leases(js, kv, SERVICE, self.replica, S.EPISODE_PARTITIONS)
            log.info("replica %s consuming %s (merge=%s mode=%s)", self.replica, S.EPISODE_PARTS_STREAM,
                     self.cfg.merge, self.cfg.merge_mode)  # fmt: skip
            while not self._stop.is_set():
                await self._rebalance(leases)
                if time.monotonic() - self._last_stats > self.cfg.stats_interval_s:
                    self._last_stats = time.monotonic()
                    self.log_stats()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=self.cfg.lease_interval_s)
        except Stopping:
            pass
        finally:
            # Hand unfinished work back now: the partitions' next owners replay it.
            for p in list(self.partitions):
                self._begin_stop(p)
            stopping = list(self._stopping.values())
            if stopping:
                await asyncio.wait(stopping, timeout=30)
            if leases is not None and not nc.is_closed:
                with contextlib.suppress(Exception):
                    await nc.flush(timeout=5)  # the naks first, then the leases: successors replay at once
                    await asyncio.wait_for(leases.leave(), timeout=10)
            self.log_stats()
            if not nc.is_closed:
                # flush, not drain: the acks and naks must reach the server, but draining waits on the
                # pull subscriptions' expired fetch requests for their whole timeout.
                try:
                    await nc.flush(timeout=5)
                except Exception as exc:  # what did not reach the server comes back after the ack wait
                    log.warning("final flush failed: %r", exc)
                await bus.close(nc)

    async def _rebalance(self, leases: Leases) -> None:
        """Renew and rebalance the leases, then make the partitions at work match them: every partition
        held and none other, and none at all while the leases may have expired unrenewed (fenced: another
        replica may own them by now). Stopping never blocks renewal: a partition given back is released
        once its work has stopped, at a later round."""
        give_back: list[int] = []
        try:
            give_back = await leases.tick()
            self._renewed = time.monotonic()
        except (nats.errors.Error, TimeoutError) as exc:  # the broker is away: try again next round
            log.warning("lease renewal failed: %r", exc)
        fenced = time.monotonic() - self._renewed > bus.LEASE_TTL_S - self.cfg.lease_interval_s
        keep = set() if fenced else set(leases.held) - set(give_back)
        self._releasing.update(give_back)
        for p in [p for p in self.partitions if p not in keep]:
            self._begin_stop(p)
        for p, task in list(self._stopping.items()):
            if task.done():
                del self._stopping[p]
                if not task.cancelled() and (failed := task.exception()) is not None:
                    log.warning("partition %d ended with %r while stopping", p, failed)
                if p in self._releasing:
                    self._releasing.discard(p)
                    await leases.release(p)
        for p, task in list(self._tasks.items()):
            if task.done():  # a failure fails the merger, as a crash would: its episodes stay unacked
                if not task.cancelled() and (failed := task.exception()) is not None:
                    raise failed
                del self._tasks[p], self.partitions[p]
        for p in sorted(keep - set(self.partitions) - set(self._stopping)):
            self._start_partition(p)

    def _start_partition(self, p: int) -> None:
        assert self._js is not None
        part = self.partitions[p] = Partition(self, p, self._js)
        self._tasks[p] = asyncio.create_task(part.run(), name=f"merger-p{p}")

    def _begin_stop(self, p: int) -> None:
        self.partitions.pop(p).request_stop()
        self._stopping[p] = self._tasks.pop(p)

    def log_stats(self) -> None:
        dead = dict(self.dlq.counts) if self.dlq else {}
        log.info(
            "counters: merged=%d empty=%d eval=%d aborted=%d timeout=%d samples=%d dead_letters=%d %s "
            "partitions=%d open=%d held=%d",
            self.counts["merged"], self.counts["empty"], self.counts["eval"], self.counts["aborted"],
            self.counts["timeout"], self.counts["samples"], sum(dead.values()), dead, len(self.partitions),
            len(self.episodes), len(self.held),
        )  # fmt: skip

    async def _publish(self, subject: str, data: bytes, msg_id: str) -> None:
        assert self._js is not None
        await retry(self._stop, self._js.publish, subject, data, headers={"Nats-Msg-Id": msg_id})


class Partition:
    """One partition's consumer and open episodes: the merger of one slice of the episode space."""

    def __init__(self, merger: Merger, partition: int, js: JetStreamContext) -> None:
        self.merger = merger
        self.cfg = cfg = merger.cfg
        self.partition = partition
        self.opts = cfg.options()
        self.tracker = EpisodeTracker()
        self.episodes: dict[str, OpenEpisode] = {}
        self.held: dict[int, Held] = {}
        self.parked: dict[int, Parked] = {}
        """Events that came before their episode's begin, by stream sequence (`_park`)."""
        self._park_until: dict[str, float] = {}
        """Episode id -> when its parked events are dead-lettered if its begin has not come."""
        self.counts = merger.counts
        self._js = js
        self._due: list[Callable[[], Awaitable[None]]] = []
        """Closings (publish, then ack) of episodes that ended in the current batch."""
        self._acked: RecentAcks[int] = RecentAcks(keep_s=2 * cfg.ack_wait_s)
        self._stop = asyncio.Event()
        self._last_keepalive = time.monotonic()
        self.replay_upto = 0
        """The partition's last stream sequence when we took it: what our consumer replays up to."""
        self.leftovers_upto = 0
        """`replay_upto` when we took the partition from an earlier owner (its consumer existed), else 0:
        a replayed event of an episode we never saw begin is what that owner left of an episode it
        closed (`_accept`)."""

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Consume the partition from a fresh consumer (module docstring) until stopped; on the way out
        hand back what is held."""
        stream, prefix = S.EPISODE_PARTS_STREAM, f"{SERVICE}-p{self.partition}-"

        # Our own consumer, the partition's others deleted: a work queue allows one consumer per
        # partition, and an owner that lost its lease unnoticed reads from a deleted consumer, nothing.
        async def fresh_consumer() -> JetStreamContext.PullSubscription:
            self.replay_upto = (await self._js.stream_info(stream)).state.last_seq
            self.leftovers_upto = 0
            for info in await self._js.consumers_info(stream):
                if info.name.startswith(prefix):
                    self.leftovers_upto = self.replay_upto  # an owner before us may have left some
                    with contextlib.suppress(NotFoundError):
                        await self._js.delete_consumer(stream, info.name)
            return await bus.durable_pull(
                self._js, stream, prefix + self.merger.replica, S.partition_filter(self.partition),
                ack_wait_s=self.cfg.ack_wait_s, max_ack_pending=self.cfg.max_ack_pending,
            )  # fmt: skip

        try:  # a cluster electing leaders answers 503 for a while: wait it out, as for publishes
            sub = await retry(self._stop, fresh_consumer)
        except Stopping:
            return
        try:
            async for msgs in bus.batches(sub, self._stop, self.cfg.fetch_batch, dead_letters=self._dlq()):
                caught_up = not msgs or msgs[-1].metadata.num_pending == 0
                for msg in msgs:
                    await self.handle(msg)
                await self.settle()
                await self.tick(caught_up and self.merger.leased())
        except Stopping:
            pass
        finally:
            await self._nak([h.msg for h in (*self.held.values(), *self.parked.values())])
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- one message ---------------------------------------------------------------------------

    async def handle(self, msg: Msg) -> None:
        """Decide what one event becomes: held, dead-lettered (and acked), or acked."""
        meta = msg.metadata
        seq = meta.sequence.stream
        held = self.held.get(seq) or self.parked.get(seq)
        if held is not None:  # redelivered although we hold it (the ack wait ran out): keep the newest
            held.msg, held.touched = msg, time.monotonic()
            self.counts["redelivered"] += 1
            return
        try:
            await self._accept(msg, seq, meta.num_delivered)
        except Stopping:
            raise
        except Exception as exc:  # a bug on one message must not stop the swarm: dead-letter it
            log.exception("subject=%s failed: %s", msg.subject, exc)
            await retry(self._stop, self._dlq().send, msg, f"internal: {type(exc).__name__}: {exc}")
            held = self.held.get(seq)
            if held is not None:  # it joined an episode we can no longer trust: release the episode
                self.tracker.close(held.episode_id, "abort")
                await self._ack_episode(held.episode_id)
            else:
                await self._ack(msg, seq)

    async def _accept(self, msg: Msg, seq: int, delivered: int) -> None:
        try:
            ev = decode_event(msg.data)
            check_subject(S.unpartitioned(msg.subject), ev)
        except WireError as exc:
            return await retry(self._stop, self._dead_letter, msg, str(exc))
        eid = ev.episode_id
        if delivered > 1 and seq in self._acked:  # handled already; only our ack got lost
            self.counts["redelivered_acked"] += 1
            return await self._ack(msg, seq)
        if seq <= self.replay_upto and eid not in self.episodes and eid in self.merger.closed:
            # this process closed the episode under an earlier consumer of the partition, and some of
            # its acks were lost with that consumer (a broker outage): handled already
            self.counts["replayed_closed"] += 1
            return await self._ack(msg, seq)
        if self.tracker.late_call(ev):  # finished after its client aborted: dropped with the episode
            self.counts["late_calls"] += 1
            return await self._ack(msg, seq)
        reason = self.tracker.check(ev, received=time.monotonic())
        if reason is not None and reason.startswith("unknown_episode") and seq <= self.leftovers_upto:
            # An earlier owner closed this episode and acked its begin, but not this event: it died
            # between the acks, or they were lost with a broker node. An open episode's events are
            # all unacked, begin included, so the replay would have brought its begin first.
            self.counts["replayed_leftovers"] += 1
            log.info(
                "subject=%s seq=%d: left over from an episode closed before the takeover", msg.subject, seq
            )
            return await self._ack(msg, seq)
        if reason is not None and reason.startswith("unknown_episode"):
            return self._park(msg, seq, eid, reason)
        if reason is not None:
            held = self.episodes[eid].seqs if eid in self.episodes else None
            log.warning("partition %d: stream seq %d (delivery %d) refused; its episode holds seqs %s",
                        self.partition, seq, delivered, held)  # fmt: skip
            return await retry(self._stop, self._dead_letter, msg, reason)
        if isinstance(ev, BeginEvent):
            self.episodes[eid] = OpenEpisode(begin=ev)
        ep = self.episodes[eid]
        ep.seqs.append(seq)
        self.held[seq] = Held(msg, time.monotonic(), eid)
        if isinstance(ev, LlmEvent):
            ep.call_seqs.append(seq)
        elif isinstance(ev, RewardEvent):
            ep.rewards.append(ev)
        elif ev.kind == "end":
            self._due.append(partial(self._finish, ep, msg))
        elif ev.kind == "abort":
            stats = dropped_stats(eid, self._calls(ep), "aborted", ev.reason or "aborted by client", ep.begin)
            self._due.append(partial(self._close, stats))
        if isinstance(ev, BeginEvent) and eid in self._park_until:
            for later, parked in self._unpark(eid):  # in stream order, after their begin
                self.counts["unparked"] += 1
                await self._accept(parked.msg, later, parked.msg.metadata.num_delivered)

    def _park(self, msg: Msg, seq: int, eid: str, reason: str) -> None:
        """Hold an event whose begin has not come (module docstring) until it comes or two ack waits
        pass; `reason` (`unknown_episode: ...`) is what it is dead-lettered with then."""
        self._park_until.setdefault(eid, time.monotonic() + 2 * self.cfg.ack_wait_s)
        self.parked[seq] = Parked(msg, time.monotonic(), eid, reason)
        self.counts["parked"] += 1

    def _unpark(self, eid: str) -> list[tuple[int, Parked]]:
        """Take episode `eid`'s parked events out, in stream order."""
        del self._park_until[eid]
        mine = sorted(seq for seq, parked in self.parked.items() if parked.episode_id == eid)
        return [(seq, self.parked.pop(seq)) for seq in mine]

    def _calls(self, ep: OpenEpisode) -> list[LlmEvent]:
        """The episode's LLM calls, decoded again from the held bytes (validated when they came)."""
        return [cast(LlmEvent, decode_event(self.held[seq].msg.data)) for seq in ep.call_seqs]

    def _dlq(self) -> bus.DeadLetters:
        assert self.merger.dlq is not None, "run() sets up the dead-letter publisher"
        return self.merger.dlq

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        await self._dlq().send(msg, reason)
        await self._ack(msg, msg.metadata.sequence.stream)

    async def _ack(self, msg: Msg, seq: int) -> None:
        if not msg.is_acked:
            await msg.ack()
        self._acked.add(seq, time.monotonic())

    # -- episode outcomes ----------------------------------------------------------------------

    async def settle(self) -> None:
        """Publish and ack the episodes closed by the last batch, all at once: a merger is bound by
        publish round trips, not CPU. Each episode still acks only after its own publishes."""
        due, self._due = self._due, []
        # Let every closing finish before raising: none is left half-done behind our back.
        for result in await asyncio.gather(*(close() for close in due), return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def _finish(self, ep: OpenEpisode, end: Msg) -> None:
        """Publish the samples (every model's) and stats of an ended episode, then ack its events.

        Whatever fails before the first publish drops the episode whole: none of it was published.
        From the first publish on a failure is not caught: some samples may be stored, so the episode
        must stay unacked for a replay that publishes all of them again (module docstring).
        """
        eid = ep.begin.episode_id
        calls: list[LlmEvent] = []
        try:
            calls = self._calls(ep)
            samples, stats = assemble(ep.begin, calls, ep.rewards, self.opts)
            out = [(S.samples_subject(s.model), encode(s), s.sample_id) for s in samples]
            # Headers count against both limits; a sample rejected after its siblings were stored
            # would make the episode fail on every replay, so oversized ones are caught here.
            limit = self.merger._max_payload - HEADER_MARGIN
            big = [(msg_id, len(data)) for _, data, msg_id in out if len(data) + len(msg_id) > limit]
            if big:
                raise ValueError(
                    f"oversized: samples {big} exceed the max payload of {self.merger._max_payload} bytes"
                )
        except Exception as exc:  # cannot merge this episode: record why, never hold it forever
            log.exception("subject=%s episode=%s merge failed", end.subject, eid)
            await retry(self._stop, self._dlq().send, end, f"merge: {type(exc).__name__}: {exc}")
            return await self._close(dropped_stats(eid, calls, "aborted", f"merge failed: {exc}", ep.begin))
        try:
            await self._close(stats, out)
        except Stopping:
            raise
        except Exception:
            log.exception("subject=%s episode=%s publish failed; left unacked for a replay", end.subject, eid)
            raise
        self.counts["samples"] += len(out)
        self.counts["eval" if ep.begin.eval else stats.status] += 1
        log.info(
            "subject=%s episode=%s merged: %d calls -> %d samples, tokens %d -> %d, trained %d -> %d",
            end.subject, eid, stats.calls, stats.timelines_kept, stats.tokens_before, stats.tokens_after,
            stats.trained_tokens_before, stats.trained_tokens_after,
        )  # fmt: skip

    async def _close(self, stats: MergeStats, samples: list[tuple[str, bytes, str]] | None = None) -> None:
        """Publish the episode's samples (subject, payload, msg id), the models it sends no sample
        (`LostEpisode`) and its stats, then ack all its events."""
        out = [
            *(samples or []),
            *(
                (S.lost_subject(r.model), encode(r), f"lost-{r.episode_id}-{r.model}")
                for r in lost_episodes(stats)
            ),
            (S.MERGE_METRICS_SUBJECT, encode(stats), f"merge-{stats.episode_id}"),
        ]
        results = await asyncio.gather(
            *(self._publish(subject, data, msg_id) for subject, data, msg_id in out), return_exceptions=True
        )
        # Every publish has finished (none is left running behind a failure); ack only if all held.
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if stats.status in ("aborted", "timeout"):
            self.counts[stats.status] += 1
            log.info("episode=%s %s: %s", stats.episode_id, stats.status, stats.reason)
        await self._ack_episode(stats.episode_id)

    async def _ack_episode(self, episode_id: str) -> None:
        self.merger.closed.add(episode_id, time.monotonic())
        ep = self.episodes.pop(episode_id, None)
        # Begin first: if we die halfway (or a broker node loses some acks), the rest come back to the
        # partition's next owner without their begin, which acks them as leftovers (`_accept`),
        # instead of rebuilding a partial episode.
        for seq in ep.seqs if ep else []:
            held = self.held.pop(seq, None)
            if held is not None:
                await self._ack(held.msg, seq)

    # -- housekeeping ----------------------------------------------------------------------------

    async def tick(self, caught_up: bool = True) -> None:
        """Between batches: time out silent episodes, keep held messages alive.

        Episodes time out only while we are caught up with the stream: with a backlog on our side,
        their next events may be waiting in it, and our lag must not look like the agent's silence.
        """
        now = time.monotonic()
        for eid in self.tracker.expire(now, self.cfg.episode_timeout_s) if caught_up else []:
            ep = self.episodes.get(eid)
            calls = self._calls(ep) if ep else []
            reason = f"no event for {self.cfg.episode_timeout_s:g}s"
            stats = dropped_stats(eid, calls, "timeout", reason, ep.begin if ep else None)
            self._due.append(partial(self._close, stats))
        await self.settle()
        for eid in [eid for eid, until in self._park_until.items() if now >= until]:
            for _, parked in self._unpark(eid):
                await retry(self._stop, self._dead_letter, parked.msg, parked.reason)
        if now - self._last_keepalive > self.cfg.ack_wait_s / 4:
            self._last_keepalive = now
            for held in [*self.held.values(), *self.parked.values()]:
                if now - held.touched > self.cfg.ack_wait_s / 2:
                    await held.msg.in_progress()
                    held.touched = now
                    self.counts["keepalive"] += 1
            if len(self.held) > 0.9 * self.cfg.max_ack_pending:
                log.warning("partition %d holds %d unacked events, near max_ack_pending=%d", self.partition,
                            len(self.held), self.cfg.max_ack_pending)  # fmt: skip

    async def _publish(self, subject: str, data: bytes, msg_id: str) -> None:
        await self.merger._publish(subject, data, msg_id)

    async def _nak(self, msgs: list[Msg]) -> None:
        try:
            for msg in msgs:
                await msg.nak()
        except nats.errors.Error as exc:  # connection gone: the ack wait returns them instead
            log.warning("could not hand back %d messages: %s", len(msgs), exc)
