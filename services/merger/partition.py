"""One partition of EPISODE_PARTS, merged by one merger replica: its consumer, open episodes and the loop.

The loop, per fetched batch: `handle` each event (held in its open episode, parked until its begin
comes, acked or dead-lettered), `settle` the episodes that batch closed (publish, then ack), then
`tick` (time out silent episodes, dead-letter events whose begin never came, keep held events
alive). The events it holds are in one `Inflight` (`inflight.py`). See `service.py` for the
guarantees (ack discipline, takeover, all or none across models).

A begin can come after its episode's later events: a delivery lost in flight with a broker node comes
back only after the ack wait, behind whatever was delivered since. So an event of an episode whose
begin has not come is parked (kept unacked and alive, counted `parked`) for two ack waits; if its
begin comes, the parked events follow it in stream order (`unparked`), else they are dead-lettered
as `unknown_episode`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, cast

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from swarmrl.schemas import BeginEvent, LlmEvent, MergeStats, RewardEvent, WireError, decode_event, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.leases import take_consumer
from swarmrl.services.common.lifecycle import EpisodeTracker, check_subject
from swarmrl.services.common.retry import Stopping, retry
from swarmrl.services.merger.assembler import assemble, dropped_stats, lost_episodes
from swarmrl.services.merger.inflight import Inflight, OpenEpisode

if TYPE_CHECKING:
    from swarmrl.services.merger.service import Merger

log = logging.getLogger("swarmrl.merger")
HEADER_MARGIN = 64
"""Bytes of a sample's headers besides its msg id (`NATS/1.0`, `Nats-Msg-Id: `, line ends)."""


class Partition:
    """One partition's consumer and open episodes: the merger of one slice of the episode space."""

    def __init__(
        self,
        merger: Merger,
        partition: int,
        js: JetStreamContext,
        dlq: bus.DeadLetters,
        stop: asyncio.Event,
        owned: Callable[[], bool],
    ) -> None:
        self.merger = merger
        self.cfg = cfg = merger.cfg
        self.partition = partition
        self.opts = cfg.options()
        self.tracker = EpisodeTracker()
        self.episodes: dict[str, OpenEpisode] = {}
        self.counts = merger.counts
        self.inflight = Inflight(cfg.ack_wait_s, self.counts)
        self.dlq = dlq
        self._js = js
        self._due: list[Callable[[], Awaitable[None]]] = []
        """Closings (publish, then ack) of episodes that ended in the current batch."""
        self._stop = stop
        """Set when the partition is no longer ours (lost, given back, fenced) or the merger stops."""
        self.owned = owned
        """Were the leases renewed recently enough that no other replica can have taken this one?"""
        self.replay_upto = 0
        """The partition's last stream sequence when we took it: what our consumer replays up to."""
        self.leftovers_upto = 0
        """`replay_upto` when we took the partition from an earlier owner (its consumer existed), else 0:
        a replayed event of an episode we never saw begin is what that owner left of an episode it
        closed (`_accept`)."""

    async def run(self) -> None:
        """fetch -> handle -> settle -> tick, from a fresh consumer (`service.py`) until stopped; on
        the way out hand back what is held."""
        try:  # a cluster electing leaders answers 503 for a while: wait it out, as for publishes
            sub = await retry(self._stop, self._fresh_consumer)
        except Stopping:
            return
        try:
            async for msgs in bus.batches(sub, self._stop, self.cfg.fetch_batch, dead_letters=self.dlq):
                caught_up = not msgs or msgs[-1].metadata.num_pending == 0
                for msg in msgs:
                    await self.handle(msg)
                await self.settle()
                await self.tick(caught_up and self.owned())
        except Stopping:
            pass
        finally:
            await self.inflight.nak_all()
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _fresh_consumer(self) -> JetStreamContext.PullSubscription:
        stream, prefix = S.EPISODE_PARTS_STREAM, f"merger-p{self.partition}-"
        self.replay_upto = (await self._js.stream_info(stream)).state.last_seq
        sub, existed = await take_consumer(
            self._js, stream, prefix, prefix + self.merger.replica, S.partition_filter(self.partition),
            ack_wait_s=self.cfg.ack_wait_s, max_ack_pending=self.cfg.max_ack_pending,
        )  # fmt: skip
        self.leftovers_upto = self.replay_upto if existed else 0  # an owner before us may have left some
        return sub

    # -- one message ---------------------------------------------------------------------------

    async def handle(self, msg: Msg) -> None:
        """Decide what one event becomes: held, parked, dead-lettered (and acked), or acked."""
        meta = msg.metadata
        seq = meta.sequence.stream
        if self.inflight.refresh(seq, msg):
            return
        try:
            await self._accept(msg, seq, meta.num_delivered)
        except Stopping:
            raise
        except Exception as exc:  # the loop survives a bug on one message: it is dead-lettered
            log.exception("subject=%s failed: %s", msg.subject, exc)
            await retry(self._stop, self.dlq.send, msg, f"internal: {type(exc).__name__}: {exc}")
            held = self.inflight.held.get(seq)
            if held is not None:  # it joined an episode we can no longer trust: release the episode
                self.tracker.close(held.episode_id, "abort")
                await self._ack_episode(held.episode_id)
            else:
                await self.inflight.ack(msg, seq)

    async def _accept(self, msg: Msg, seq: int, delivered: int) -> None:
        try:
            ev = decode_event(msg.data)
            check_subject(S.unpartitioned(msg.subject), ev)
        except WireError as exc:
            return await retry(self._stop, self._dead_letter, msg, str(exc))
        eid = ev.episode_id
        if delivered > 1 and seq in self.inflight.acked:  # handled already; only our ack got lost
            self.counts["redelivered_acked"] += 1
            return await self.inflight.ack(msg, seq)
        if seq <= self.replay_upto and eid not in self.episodes and eid in self.merger.closed:
            # this process closed the episode under an earlier consumer of the partition, and some of
            # its acks were lost with that consumer (a broker outage): handled already
            self.counts["replayed_closed"] += 1
            return await self.inflight.ack(msg, seq)
        if self.tracker.late_call(ev):  # finished after its client aborted: dropped with the episode
            self.counts["late_calls"] += 1
            return await self.inflight.ack(msg, seq)
        reason = self.tracker.check(ev, received=time.monotonic())
        if reason is not None and reason.startswith("unknown_episode") and seq <= self.leftovers_upto:
            # An earlier owner closed this episode and acked its begin, but not this event: it died
            # between the acks, or they were lost with a broker node. An open episode's events are
            # all unacked, begin included, so the replay would have brought its begin first.
            self.counts["replayed_leftovers"] += 1
            log.info(
                "subject=%s seq=%d: left over from an episode closed before the takeover", msg.subject, seq
            )
            return await self.inflight.ack(msg, seq)
        if reason is not None and reason.startswith("unknown_episode"):
            return self.inflight.park(seq, msg, eid, reason)
        if reason is not None:
            held = self.episodes[eid].seqs if eid in self.episodes else None
            log.warning("partition %d: stream seq %d (delivery %d) refused; its episode holds seqs %s",
                        self.partition, seq, delivered, held)  # fmt: skip
            return await retry(self._stop, self._dead_letter, msg, reason)
        if isinstance(ev, BeginEvent):
            self.episodes[eid] = OpenEpisode(begin=ev)
        ep = self.episodes[eid]
        ep.seqs.append(seq)
        self.inflight.hold(seq, msg, eid)
        if isinstance(ev, LlmEvent):
            ep.call_seqs.append(seq)
        elif isinstance(ev, RewardEvent):
            ep.rewards.append(ev)
        elif ev.kind == "end":
            self._due.append(partial(self._finish, ep, msg))
        elif ev.kind == "abort":
            stats = dropped_stats(eid, self._calls(ep), "aborted", ev.reason or "aborted by client", ep.begin)
            self._due.append(partial(self._close, stats))
        if isinstance(ev, BeginEvent) and eid in self.inflight.park_until:
            for later, parked in self.inflight.unpark(eid):  # in stream order, after their begin
                self.counts["unparked"] += 1
                await self._accept(parked.msg, later, parked.msg.metadata.num_delivered)

    def _calls(self, ep: OpenEpisode) -> list[LlmEvent]:
        """The episode's LLM calls, decoded again from the held bytes (validated when they came)."""
        return [cast(LlmEvent, decode_event(self.inflight.held[seq].msg.data)) for seq in ep.call_seqs]

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        await self.dlq.send(msg, reason)
        await self.inflight.ack(msg, msg.metadata.sequence.stream)

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
        must stay unacked for a replay that publishes all of them again (`service.py`).
        """
        eid = ep.begin.episode_id
        calls: list[LlmEvent] = []
        try:
            calls = self._calls(ep)
            samples, stats = assemble(ep.begin, calls, ep.rewards, self.opts)
            out = [(S.samples_subject(s.model), encode(s), s.sample_id) for s in samples]
            # Headers count against both limits; a sample rejected after its siblings were stored
            # would make the episode fail on every replay, so oversized ones are caught here.
            limit = self.merger.max_payload - HEADER_MARGIN
            big = [(msg_id, len(data)) for _, data, msg_id in out if len(data) + len(msg_id) > limit]
            if big:
                raise ValueError(
                    f"oversized: samples {big} exceed the max payload of {self.merger.max_payload} bytes"
                )
        except Exception as exc:  # the loop survives an episode it cannot merge: recorded as dropped
            log.exception("subject=%s episode=%s merge failed", end.subject, eid)
            await retry(self._stop, self.dlq.send, end, f"merge: {type(exc).__name__}: {exc}")
            return await self._close(dropped_stats(eid, calls, "aborted", f"merge failed: {exc}", ep.begin))
        try:
            await self._close(stats, out)
        except (nats.errors.Error, TimeoutError):  # logged with its episode, then a crash (unacked)
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
            *(self.merger.publish(subject, data, msg_id) for subject, data, msg_id in out),
            return_exceptions=True,
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
        await self.inflight.ack_held(ep.seqs if ep else [])

    # -- housekeeping ----------------------------------------------------------------------------

    async def tick(self, caught_up: bool = True) -> None:
        """Between batches: time out silent episodes, dead-letter the parked events whose begin did
        not come, keep held messages alive.

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
        for parked in self.inflight.expired(now):
            await retry(self._stop, self._dead_letter, parked.msg, parked.reason)
        if await self.inflight.keep_alive(now) and len(self.inflight.held) > 0.9 * self.cfg.max_ack_pending:
            log.warning("partition %d holds %d unacked events, near max_ack_pending=%d", self.partition,
                        len(self.inflight.held), self.cfg.max_ack_pending)  # fmt: skip
