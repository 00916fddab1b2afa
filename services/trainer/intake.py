"""Every sample message from delivery to settlement: what it becomes (`SampleIntake`), and the book of
messages not yet settled (`Unacked`), the only code that acks, naks, dead-letters or keeps one alive.

Consumes `swarm.samples.<model>` and `swarm.samples.<model>.lost` through the trainer's durable
consumer; publishes bad messages to `swarm.dlq.trainer`. A sample is
- held in the `GroupBuffer` until its step is checkpointed, its version put and its TrainStep
  published, then acked;
- dropped with a reason (stale on arrival, with its episode; later, with its group), acked once a
  TrainStep or SampleDrops report names it;
- acked at once when the last checkpointed step trained it (a redelivery);
- dead-lettered and acked when malformed or untrainable (so are, after their step, the samples of an
  update the learner refused for a non-finite loss or gradient).
A lost-episode record is a credit of its group (`GroupBuffer.note_lost`), acked with the group's
samples or with the next report. Messages are held by stream sequence; on a stop all are nak'ed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg

from swarmrl.schemas import LostEpisode, Sample, WireError, decode, decode_sample
from swarmrl.schemas import subjects as S
from swarmrl.services.common.bus import DeadLetters
from swarmrl.services.trainer.batching import truncate
from swarmrl.services.trainer.grouping import GroupBuffer, Held
from swarmrl.services.trainer.grpo import check_sample, staleness

log = logging.getLogger("swarmrl.trainer.intake")


@dataclass
class Dropped:
    """A sample that will not be trained, and why: acked once a report names it."""

    sample: Sample
    reason: str


def reasons(dropped: Iterable[Dropped]) -> dict[str, str]:
    """Sample id -> why it was dropped: what a report names."""
    return {d.sample.sample_id: d.reason for d in dropped}


class Unacked:
    def __init__(self, dead_letters: DeadLetters, ack_wait_s: float, report_s: float) -> None:
        self.dead_letters = dead_letters
        self.msgs: dict[int, Msg] = {}
        """Every held message by stream sequence: its newest delivery (whose ack acks the sequence)."""
        self.dropped: dict[int, Dropped] = {}  # held samples to name in the next report
        self.spent: list[int] = []
        """Held lost-episode records no group will use: acked with the next report, or alone."""
        self.report_s, self.dropped_since = report_s, 0.0
        self.keep_alive_s, self.kept_alive = ack_wait_s / 3, time.monotonic()

    def take(self, msg: Msg) -> int | None:
        """Hold `msg`; its key, or None when it is a redelivery of a message held already."""
        key = msg.metadata.sequence.stream
        held = key in self.msgs
        self.msgs[key] = msg
        return None if held else key

    def drop(self, held: Iterable[Held], reason: str) -> None:
        for h in held:
            if not self.dropped:
                self.dropped_since = time.monotonic()
            self.dropped[h.handle] = Dropped(h.sample, reason)

    def spend(self, keys: Iterable[int]) -> None:
        self.spent.extend(keys)

    def report_due(self, now: float) -> bool:
        """Drops wait `report_s` for a step to report them (until acked they count as backlog)."""
        return bool(self.dropped) and now - self.dropped_since > self.report_s

    def take_report(self) -> tuple[list[Dropped], list[int]]:
        """The drops to report, and the keys to ack once the report is out: theirs and the spent ones."""
        dropped, self.dropped = self.dropped, {}
        return list(dropped.values()), [*dropped, *self.take_spent()]

    def take_spent(self) -> list[int]:
        spent, self.spent = self.spent, []
        return spent

    async def ack(self, keys: Iterable[int]) -> None:
        """Ack held messages whose effects are durable; a failure propagates (the rest stay held)."""
        for key in keys:
            if (msg := self.msgs.pop(key, None)) is not None:
                await msg.ack()

    async def dead_letter(self, key: int, reason: str) -> None:
        msg = self.msgs.pop(key)
        await self.dead_letters.send(msg, reason)
        await msg.ack()

    async def keep_alive(self, now: float) -> None:
        if now - self.kept_alive > self.keep_alive_s:
            self.kept_alive = now
            for msg in self.msgs.values():
                await msg.in_progress()

    async def nak_all(self) -> None:
        msgs, self.msgs = list(self.msgs.values()), {}
        try:
            for msg in msgs:
                await msg.nak()
        except (nats.errors.Error, OSError) as exc:  # connection gone: they come back after ack_wait
            log.warning(
                "could not nak %d held samples (%s); they are redelivered after ack_wait", len(msgs), exc
            )


class SampleIntake:
    def __init__(
        self,
        model: str,
        buffer: GroupBuffer,
        unacked: Unacked,
        *,
        vocab_size: int,
        max_tokens: int,
        max_staleness: int,
        counts: Counter[str],
        already_trained: Iterable[str] = (),
    ) -> None:
        self.model, self.lost_subject = model, S.lost_subject(model)
        self.buffer, self.unacked, self.counts = buffer, unacked, counts
        self.vocab_size, self.max_tokens, self.max_staleness = vocab_size, max_tokens, max_staleness
        self.already_trained = set(already_trained)  # the last checkpointed step's samples

    async def handle(self, msg: Msg, version: int, now: float) -> None:
        """Hold, drop or dead-letter one sample message; never raises."""
        if (key := self.unacked.take(msg)) is None:  # redelivered while held: the newest handle is kept
            self.counts["redelivered"] += 1
            return
        try:
            action, detail = self._classify(msg, version)
        except WireError as exc:
            action, detail = "dead", str(exc)
        except Exception as exc:  # the intake survives a bug on one message: it is dead-lettered
            log.exception("subject=%s unexpected error handling a sample", msg.subject)
            action, detail = "dead", f"internal: {type(exc).__name__}: {exc}"
        try:
            match action, detail:
                case "hold", Sample():
                    await self.unacked.ack(self.buffer.add(detail, key, now))  # a copy it replaced
                case "lost", LostEpisode():
                    await self.unacked.ack(
                        self.buffer.note_lost(detail.group_key, detail.episode_id, key, now)
                    )
                case "stale", Sample():
                    siblings = self.buffer.discard(detail, now)  # its episode leaves its group
                    self.counts["dropped_stale"] += 1 + len(siblings)
                    self.unacked.drop([Held(detail, key, now), *siblings], "stale")
                case "drop", str():
                    self.counts[detail] += 1
                    await self.unacked.ack([key])
                case _:
                    self.counts["dead_letters"] += 1
                    await self.unacked.dead_letter(key, str(detail))
        except Exception:  # the intake survives any failure to settle a message: NATS redelivers it
            log.warning("subject=%s could not %s a sample; it will be redelivered", msg.subject, action)

    def _classify(self, msg: Msg, version: int) -> tuple[str, Sample | LostEpisode | str]:
        """("hold"|"stale", sample) | ("lost", record) | ("drop", counter) | ("dead", reason)."""
        if msg.subject == self.lost_subject:
            lost = decode(msg.data, LostEpisode)
            if lost.model != self.model:
                return "dead", f"subject: lost episode of model {lost.model} on {msg.subject!r}"
            return "lost", lost
        sample = decode_sample(msg.data)
        reason = check_sample(sample, self.model, self.vocab_size) or self.buffer.mismatch(sample)
        if reason is not None:
            return "dead", reason
        if sample.sample_id in self.already_trained:
            return "drop", "already_trained"
        if staleness(sample, version) > self.max_staleness or self.buffer.is_discarded(sample):
            return "stale", sample
        if len(sample.token_ids) > self.max_tokens:
            self.counts["truncated"] += 1
            sample = truncate(sample, self.max_tokens)
        return "hold", sample
