"""One partition of EPISODE_PARTS, merged by one merger replica: its consumer, open episodes and the loop.

Per fetched batch: `handle` each event (held, parked, acked or dead-lettered), `settle` the
episodes the batch closed (publish, then ack), then `tick` (time-outs, keep-alives). Guarantees:
`service.py`. A begin can come after its episode's later events (a lost delivery comes back after
the ack wait), so such events are parked for two ack waits: they follow their begin if it comes
(`unparked`), else they are dead-lettered as `unknown_episode`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
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
from swarmrl.services.merger.assembler import assemble, episode_stats, lost_episodes
from swarmrl.services.merger.inflight import Inflight, OpenEpisode

if TYPE_CHECKING:
    from swarmrl.services.merger.service import Merger

log = logging.getLogger("swarmrl.merger")
HEADER_MARGIN = 64
"""Bytes of a sample's headers besides its msg id (`NATS/1.0`, `Nats-Msg-Id: `, line ends)."""


class Partition:
    """One partition's consumer and open episodes: the merger of one slice of the episode space."""

    def __init__(
        self, merger: Merger, partition: int, stop: asyncio.Event, owned: Callable[[], bool]
    ) -> None:
        assert merger.js is not None and merger.dlq is not None, "the merger connects first"
        self.merger = merger
        self.cfg = cfg = merger.cfg
        self.partition = partition
        self.opts = cfg.options()
        self.tracker = EpisodeTracker()
        self.episodes: dict[str, OpenEpisode] = {}
        self.counts = merger.counts
        self.inflight = Inflight(cfg.ack_wait_s, self.counts)
        self.dlq = merger.dlq
        self._js = merger.js
        self._due: list[Callable[[], Awaitable[None]]] = []
        """Closings (publish, then ack) of episodes that ended in the current batch."""
        self._stop = stop
        """Set when the partition is no longer ours (lost, given back, fenced) or the merger stops."""
        self.owned = owned
        """Were the leases renewed recently enough that no other replica can have taken this one?"""
        self.replay_upto = 0
        """The partition's last stream sequence when we took it: what our consumer replays up to."""
        self.leftovers_upto = 0
        """`replay_upto` when an earlier owner's consumer existed, else 0: up to it, an event of an
        episode we never saw begin is a leftover of one that owner closed (`_accept`)."""

    async def run(self) -> None:
        """fetch -> handle -> settle -> tick until stopped; on the way out hand back what is held."""
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
            held = self.inflight.held.get(seq)
            await self._dead_letter(msg, f"internal: {type(exc).__name__}: {exc}", ack=held is None)
            if held is not None:  # it joined an episode we can no longer trust: release the episode
                self.tracker.close(held.episode_id, "abort")
                await self._ack_episode(held.episode_id)

    async def _accept(self, msg: Msg, seq: int, delivered: int) -> None:
        try:
            ev = decode_event(msg.data)
            check_subject(S.unpartitioned(msg.subject), ev)
        except WireError as exc:
            return await self._dead_letter(msg, str(exc))
        eid = ev.episode_id
        if delivered > 1 and seq in self.inflight.acked:  # handled already; only our ack got lost
            return await self._skip(msg, seq, "redelivered_acked")
        if seq <= self.replay_upto and eid not in self.episodes and eid in self.merger.closed:
            # closed by this process under an earlier consumer, whose acks were lost: handled already
            return await self._skip(msg, seq, "replayed_closed")
        if self.tracker.late_call(ev):  # finished after its client aborted: dropped with the episode
            return await self._skip(msg, seq, "late_calls")
        reason = self.tracker.check(ev, received=time.monotonic())
        unknown = reason is not None and reason.startswith("unknown_episode")
        if unknown and seq <= self.leftovers_upto:
            # An earlier owner closed this episode and acked its begin, but not this event (an open
            # episode's replay would have brought its begin first).
            log.info(
                "subject=%s seq=%d: left over from an episode closed before the takeover", msg.subject, seq
            )
            return await self._skip(msg, seq, "replayed_leftovers")
        if unknown:
            return self.inflight.park(seq, msg, eid, reason)
        if reason is not None:
            held = self.episodes[eid].seqs if eid in self.episodes else None
            log.warning("partition %d: stream seq %d (delivery %d) refused; its episode holds seqs %s",
                        self.partition, seq, delivered, held)  # fmt: skip
            return await self._dead_letter(msg, reason)
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
            stats = episode_stats(eid, self._calls(ep), "aborted", ev.reason or "aborted by client", ep.begin)
            self._due.append(partial(self._close, stats))
        if isinstance(ev, BeginEvent) and eid in self.inflight.park_until:
            for later, parked in self.inflight.unpark(eid):  # in stream order, after their begin
                self.counts["unparked"] += 1
                await self._accept(parked.msg, later, parked.msg.metadata.num_delivered)

    def _calls(self, ep: OpenEpisode) -> list[LlmEvent]:
        """The episode's LLM calls, decoded again from the held bytes (validated when they came)."""
        return [cast(LlmEvent, decode_event(self.inflight.held[seq].msg.data)) for seq in ep.call_seqs]

    async def _skip(self, msg: Msg, seq: int, counter: str) -> None:
        """Ack an event that needs no handling (`counter` says why)."""
        self.counts[counter] += 1
        await self.inflight.ack(msg, seq)

    async def _dead_letter(self, msg: Msg, reason: str, ack: bool = True) -> None:
        """Dead-letter `msg` and, unless told not to, ack it (both retried through broker hiccups)."""

        async def send() -> None:
            await self.dlq.send(msg, reason)
            if ack:
                await self.inflight.ack(msg, msg.metadata.sequence.stream)

        await retry(self._stop, send)

    async def settle(self) -> None:
        """Publish and ack the episodes closed by the last batch, all at once (a merger is bound by
        publish round trips); each episode acks only after its own publishes."""
        due, self._due = self._due, []
        await _all_done(close() for close in due)

    async def _finish(self, ep: OpenEpisode, end: Msg) -> None:
        """Publish the samples (every model's) and stats of an ended episode, then ack its events. A
        failure before the first publish drops the episode; after it, it propagates (`service.py`)."""
        eid = ep.begin.episode_id
        calls: list[LlmEvent] = []
        try:
            calls = self._calls(ep)
            samples, stats = assemble(ep.begin, calls, ep.rewards, self.opts)
            out = [(S.samples_subject(s.model), encode(s), s.sample_id) for s in samples]
            # Caught here: a sample rejected after its siblings were stored would fail every replay.
            limit = self.merger.max_payload - HEADER_MARGIN
            big = [(msg_id, len(data)) for _, data, msg_id in out if len(data) + len(msg_id) > limit]
            if big:
                raise ValueError(
                    f"oversized: samples {big} exceed the max payload of {self.merger.max_payload} bytes"
                )
        except Exception as exc:  # the loop survives an episode it cannot merge: recorded as dropped
            log.exception("subject=%s episode=%s merge failed", end.subject, eid)
            await self._dead_letter(end, f"merge: {type(exc).__name__}: {exc}", ack=False)
            return await self._close(episode_stats(eid, calls, "aborted", f"merge failed: {exc}", ep.begin))
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
        await _all_done(self.merger.publish(subject, data, msg_id) for subject, data, msg_id in out)
        if stats.status in ("aborted", "timeout"):
            self.counts[stats.status] += 1
            log.info("episode=%s %s: %s", stats.episode_id, stats.status, stats.reason)
        await self._ack_episode(stats.episode_id)

    async def _ack_episode(self, episode_id: str) -> None:
        self.merger.closed.add(episode_id, time.monotonic())
        ep = self.episodes.pop(episode_id, None)
        # Begin first: if we die halfway, the rest come back without their begin, and the next owner
        # acks them as leftovers (`_accept`) instead of rebuilding a partial episode.
        await self.inflight.ack_held(ep.seqs if ep else [])

    async def tick(self, caught_up: bool = True) -> None:
        """Between batches: time out silent episodes (only when `caught_up`: our lag must not look like
        the agent's silence), dead-letter the parked events whose begin did not come, keep alive."""
        now = time.monotonic()
        for eid in self.tracker.expire(now, self.cfg.episode_timeout_s) if caught_up else []:
            ep = self.episodes.get(eid)
            calls = self._calls(ep) if ep else []
            reason = f"no event for {self.cfg.episode_timeout_s:g}s"
            stats = episode_stats(eid, calls, "timeout", reason, ep.begin if ep else None)
            self._due.append(partial(self._close, stats))
        await self.settle()
        for parked in self.inflight.expired(now):
            await self._dead_letter(parked.msg, parked.reason)
        if await self.inflight.keep_alive(now) and len(self.inflight.held) > 0.9 * self.cfg.max_ack_pending:
            log.warning("partition %d holds %d unacked events, near max_ack_pending=%d", self.partition,
                        len(self.inflight.held), self.cfg.max_ack_pending)  # fmt: skip


async def _all_done(aws: Iterable[Awaitable[object]]) -> None:
    """Await all of `aws`, then raise the first failure: none is left running behind it."""
    for result in await asyncio.gather(*aws, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
