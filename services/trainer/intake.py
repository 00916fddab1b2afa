"""What becomes of each sample message as it arrives: the trainer's intake (`SampleIntake.handle`).

Consumes: `swarm.samples.<model>` and `swarm.samples.<model>.lost` (stream SAMPLES, in stream order)
through the trainer's durable pull consumer.
Publishes: bad messages to `swarm.dlq.trainer` (original bytes + reason), then acks them.

A sample is either
- held in the `GroupBuffer` until the step that trains it is checkpointed,
- dropped with a reason and counted: stale on arrival (its episode then leaves its group, siblings
  and all), or later when its group is dropped (timeout, zero advantage, too small after
  staleness); acked once a report names it (`Unacked.drop`),
- acked at once when its last checkpointed step already trained it (a redelivery),
- dead-lettered (malformed, wrong model, untrainable) and acked.
A lost-episode record (`LostEpisode`: an episode that sends this model no sample) is held as a
credit of its group (`GroupBuffer.note_lost`) and acked with the group's samples; a malformed one
is dead-lettered like a bad sample. Every message is held by `Unacked` (`unacked.py`), which alone
settles it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from nats.aio.msg import Msg

from swarmrl.schemas import LostEpisode, Sample, WireError, decode, decode_sample
from swarmrl.schemas import subjects as S
from swarmrl.services.trainer.batching import truncate
from swarmrl.services.trainer.grouping import GroupBuffer, Held
from swarmrl.services.trainer.grpo import check_sample, staleness
from swarmrl.services.trainer.unacked import Unacked

log = logging.getLogger("swarmrl.trainer.intake")


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
        self.model = model
        self.lost_subject = S.lost_subject(model)
        self.buffer = buffer
        self.unacked = unacked
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.max_staleness = max_staleness
        self.counts = counts
        # Sample ids of the last checkpointed step: redelivered if we died between saving and acking.
        self.already_trained = set(already_trained)

    def _classify(self, msg: Msg, version: int) -> tuple[str, Sample | LostEpisode | str | None]:
        """("hold"|"stale", sample) | ("lost", record) | ("drop", counter) | ("dead", reason). Raises
        WireError on bad bytes."""
        if msg.subject == self.lost_subject:
            lost = decode(msg.data, LostEpisode)
            if lost.model != self.model:
                return "dead", f"subject: lost episode of model {lost.model} on {msg.subject!r}"
            return "lost", lost
        sample = decode_sample(msg.data)
        reason = check_sample(sample, self.model, self.vocab_size)
        if reason is None:
            reason = self.buffer.mismatch(sample)
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

    async def handle(self, msg: Msg, version: int, now: float) -> None:
        """Hold, drop or dead-letter one sample message; never raises."""
        key = self.unacked.take(msg)
        if key is None:  # redelivered while held (its ack wait ran out): the newest handle is kept
            self.counts["redelivered"] += 1
            return
        action: str
        detail: Sample | LostEpisode | str | None
        try:
            action, detail = self._classify(msg, version)
        except WireError as exc:
            action, detail = "dead", str(exc)
        except Exception as exc:  # a trainer bug must not kill the service nor lose the message
            log.exception("subject=%s unexpected error handling a sample", msg.subject)
            action, detail = "dead", f"internal: {type(exc).__name__}: {exc}"
        try:
            match action, detail:
                case "hold", Sample():
                    await self.unacked.ack(self.buffer.add(detail, key, now))  # a copy it replaced
                    log.debug(
                        "subject=%s episode=%s held %s", msg.subject, detail.episode_id, detail.sample_id
                    )
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
