"""Every message the trainer has taken and not settled, in one place: the only code that acks, naks,
dead-letters or keeps a sample message alive.

A message is held from its delivery until its effects are durable, keyed by its stream sequence
(the pure cores, `grouping.py` and `ready.py`, hold these keys, never a message):
- a sample waiting for its group, queued in a formed group, or trained by the step under way: acked
  once that step is checkpointed, its version put and its TrainStep published (`ack`);
- a sample that will not be trained (`drop`: stale, zero advantage, timed out, ...): acked once a
  TrainStep or a SampleDrops report names it with its reason (`take_report`);
- a lost-episode record: held as its group's credit and acked with the group's samples, or, when
  no group will use it (`spend`), with the next report;
- bad input, and the samples of an update the learner refused as non-finite: dead-lettered with
  their bytes, then acked (`dead_letter`). Nothing is terminated: what the trainer will not train
  leaves a trace in the DLQ or in a report.
Every held message gets an in-progress signal every third of the ack wait (`keep_alive`); on a stop
all are nak'ed so the next trainer gets them at once (`nak_all`). A message that could not be
settled is forgotten: JetStream redelivers it after the ack wait. A redelivery of a message still
held only refreshes its handle (`take` returns None): it is not taken in a second time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg

from swarmrl.schemas import Sample
from swarmrl.services.common.bus import DeadLetters
from swarmrl.services.trainer.grouping import Held

log = logging.getLogger("swarmrl.trainer.unacked")


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
        self.dropped: dict[int, Dropped] = {}
        """Held samples to name in the next report (`take_report`)."""
        self.spent: list[int] = []
        """Held lost-episode records no group will use: acked with the next report, or alone."""
        self.report_s = report_s
        self.dropped_since = 0.0
        self.keep_alive_s = ack_wait_s / 3
        self.kept_alive = time.monotonic()

    def __len__(self) -> int:
        return len(self.msgs)

    def take(self, msg: Msg) -> int | None:
        """Hold `msg`; its key, or None when it is a redelivery of a message held already."""
        key = msg.metadata.sequence.stream
        held = key in self.msgs
        self.msgs[key] = msg
        return None if held else key

    def drop(self, held: Iterable[Held], reason: str) -> None:
        """Samples that will not be trained, with the reason: acked once reported."""
        for h in held:
            if not self.dropped:
                self.dropped_since = time.monotonic()
            self.dropped[h.handle] = Dropped(h.sample, reason)

    def spend(self, keys: Iterable[int]) -> None:
        self.spent.extend(keys)

    def report_due(self, now: float) -> bool:
        """Drops wait `report_s` for a step to report them; held longer, they count as backlog for
        admission control, which then holds the very groups the next step needs."""
        return bool(self.dropped) and now - self.dropped_since > self.report_s

    def take_report(self) -> tuple[list[Dropped], list[int]]:
        """The drops to report, and the keys to ack once the report is out: theirs and the spent
        records'."""
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
        """Dead-letter a held message with `reason`, then ack it."""
        msg = self.msgs.pop(key)
        await self.dead_letters.send(msg, reason)
        await msg.ack()

    async def keep_alive(self, now: float) -> None:
        """Reset the ack timer of every held message, every third of the ack wait."""
        if now - self.kept_alive > self.keep_alive_s:
            self.kept_alive = now
            for msg in self.msgs.values():
                await msg.in_progress()

    async def nak_all(self) -> None:
        """Hand every held message back for immediate redelivery (on stop); best effort."""
        msgs, self.msgs = list(self.msgs.values()), {}
        try:
            for msg in msgs:
                await msg.nak()
        except (nats.errors.Error, OSError) as exc:  # connection gone: they come back after ack_wait
            log.warning(
                "could not nak %d held samples (%s); they are redelivered after ack_wait", len(msgs), exc
            )
