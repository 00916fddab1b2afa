"""NATS handlers of the trainer: the one place that decides what happens to a sample message.

Consumes: `swarm.samples.<model>` and `swarm.samples.<model>.lost` (stream SAMPLES, in stream order)
through the trainer's durable pull consumer.
Publishes: bad messages to `swarm.dlq.trainer` (original bytes + reason), then acks them.

A sample is either
- held (unacked) in the `GroupBuffer` until the step that trains it is checkpointed (`ack_all`),
- dropped with a reason and counted: stale on arrival (its episode then leaves its group, siblings
  and all), or later when its group is dropped (timeout, zero advantage, too small after
  staleness); acked once a TrainStep reports it (`drop` callback),
- acked at once when its last checkpointed step already trained it (a redelivery),
- dead-lettered (malformed, wrong model, untrainable) and acked; so are, after their step, the
  samples of an optimizer update the learner did not apply for a non-finite loss or gradient.
On a graceful stop every held sample is nak'ed so the next trainer gets it at once (`nak_all`).

A lost-episode record (`LostEpisode`: an episode that sends this model no sample) is held as a
credit of its group (`GroupBuffer.note_lost`) and acked with the group's samples; a malformed one
is dead-lettered like a bad sample.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from nats.aio.msg import Msg

from swarmrl.schemas import LostEpisode, Sample, WireError, decode, decode_sample
from swarmrl.schemas import subjects as S
from swarmrl.services.common.bus import DeadLetters
from swarmrl.services.trainer.batching import truncate
from swarmrl.services.trainer.grouping import GroupBuffer, Held
from swarmrl.services.trainer.grpo import check_sample, staleness

log = logging.getLogger("swarmrl.trainer.intake")


class SampleIntake:
    def __init__(
        self,
        model: str,
        buffer: GroupBuffer,
        dead_letters: DeadLetters,
        *,
        vocab_size: int,
        max_tokens: int,
        max_staleness: int,
        counts: Counter[str],
        drop: Callable[[list[Held], str], None],
        already_trained: Iterable[str] = (),
    ) -> None:
        self.model = model
        self.lost_subject = S.lost_subject(model)
        self.buffer = buffer
        self.dead_letters = dead_letters
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.max_staleness = max_staleness
        self.counts = counts
        self.drop = drop
        """Takes samples that will not be trained, with the reason (the trainer acks them once reported)."""
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
            if action == "hold":
                assert isinstance(detail, Sample)
                self.buffer.add(detail, msg, now)
                log.debug(
                    "subject=%s episode=%s held sample %s", msg.subject, detail.episode_id, detail.sample_id
                )
            elif action == "lost":
                assert isinstance(detail, LostEpisode)
                self.buffer.note_lost(detail.group_key, detail.episode_id, msg, now)
            elif action == "stale":
                assert isinstance(detail, Sample)
                siblings = self.buffer.discard(detail, now)  # its episode leaves its group
                self.counts["dropped_stale"] += 1 + len(siblings)
                self.drop([Held(detail, msg, now), *siblings], "stale")
            elif action == "drop":
                self.counts[str(detail)] += 1
                await msg.ack()
            else:
                self.counts["dead_letters"] += 1
                await self.dead_letters.send(msg, str(detail))
                await msg.ack()
        except Exception:  # NATS unavailable: leave it unacked, JetStream redelivers it after ack_wait
            log.warning("subject=%s could not %s a sample; it will be redelivered", msg.subject, action)


async def ack_all(handles: Iterable[Msg]) -> None:
    for handle in handles:
        await handle.ack()


async def dead_letter_all(held: Iterable[Held], dead_letters: DeadLetters, reasons: dict[str, str]) -> None:
    """Dead-letter held samples, each with its reason (by sample id), acking each once its dead letter
    is out; a failure propagates and leaves the rest unacked for redelivery."""
    for h in held:
        await dead_letters.send(h.handle, reasons[h.sample.sample_id])
        await h.handle.ack()


async def nak_all(handles: Iterable[Msg]) -> None:
    """Hand held messages back for immediate redelivery (on stop); best effort, ack_wait covers failures."""
    try:
        for handle in handles:
            await handle.nak()
    except Exception as exc:  # connection already gone: JetStream redelivers after ack_wait anyway
        log.warning("could not nak held samples (%s); they are redelivered after ack_wait", exc)


async def keep_alive(handles: Iterable[Msg]) -> None:
    """Reset the ack timer of messages still waiting for their group or their step."""
    for handle in handles:
        await handle.in_progress()
