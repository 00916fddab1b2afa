"""One message of EPISODES, SAMPLES, METRICS or DLQ -> `(table, row)`, or a dead-letter reason (pure logic).

Failures raise `Rejected` or the wire codec's `WireError`, whose text is `<code>: <detail>` (codes in
`lifecycle.DEAD_LETTER_CODES`). DLQ messages are recorded as they are (`tables.dead_letter_row`).
"""

from __future__ import annotations

import time

from nats.aio.msg import Msg

from swarmrl.schemas import (
    MAX_EVENT_BYTES,
    LostEpisode,
    Sample,
    WireError,
    decode,
    decode_event,
    decode_metric,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.lifecycle import EpisodeTracker, episode_of
from swarmrl.services.ledger.tables import Row, dead_letter_row, event_row, metric_row, record_row, sample_row


class Rejected(ValueError):
    """An input that breaks a rule beyond the wire contract (event ordering); `str()` is the reason."""


class Ingest:
    """Decodes and validates messages; owns the episode ordering state for EPISODES."""

    def __init__(self, tracker: EpisodeTracker | None = None, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.tracker = tracker or EpisodeTracker()
        self.max_event_bytes = max_event_bytes

    def row(self, stream: str, msg: Msg, seq: int) -> tuple[str, Row]:
        """One message of `stream` -> its (table, row), or raises why not."""
        if stream == S.EPISODES_STREAM:  # from LEDGER_PARTS too, under its partition's subject
            return self.episode(S.unpartitioned(msg.subject), msg.data, stream, seq, time.time())
        if stream == S.SAMPLES_STREAM:
            return self.sample(msg.subject, msg.data, stream, seq)
        if stream == S.METRICS_STREAM:
            return self.metric(msg.subject, msg.data, stream, seq)
        h = msg.headers or {}
        return "dead_letters", dead_letter_row(
            subject=msg.subject, data=msg.data, service=h.get(bus.SERVICE_HEADER) or msg.subject.split(".")[-1],
            original_subject=h.get(bus.SUBJECT_HEADER, ""), reason=h.get(bus.REASON_HEADER, ""),
            ts=msg.metadata.timestamp.timestamp(), stream=stream, seq=seq,
        )  # fmt: skip

    def episode(self, subject: str, data: bytes, stream: str, seq: int, received: float) -> tuple[str, Row]:
        """An episode event -> a row of `events` or `llm_calls`; updates the ordering state."""
        episode_id, kind = episode_of(subject)  # the subject's own faults first, before the payload's
        ev = decode_event(data, self.max_event_bytes)
        if ev.episode_id != episode_id or ev.kind != kind:  # lifecycle.check_subject, with the parse reused
            raise WireError(
                "subject", f"payload is {ev.kind} of episode {ev.episode_id} but subject is {subject}"
            )
        table, row = event_row(ev, stream, seq)
        # The ordering check comes last: it mutates the state, so only a row we will keep may pass it.
        # A late call (finished after its client gave up) is still a real call.
        if not self.tracker.late_call(ev) and (reason := self.tracker.check(ev, received)) is not None:
            raise Rejected(reason)
        return table, row

    def sample(self, subject: str, data: bytes, stream: str, seq: int) -> tuple[str, Row]:
        """A sample -> `samples`; a lost-episode record (`swarm.samples.<model>.lost`) -> `lost_episodes`."""
        lost = subject.endswith(".lost")
        record = decode(data, LostEpisode if lost else Sample)
        try:
            expected = (S.lost_subject if lost else S.samples_subject)(record.model)
        except ValueError as exc:
            raise WireError("subject", str(exc)) from exc
        if subject != expected:
            what = "lost episode" if lost else "sample"
            raise WireError("subject", f"{what} of model {record.model} on subject {subject!r}")
        if isinstance(record, LostEpisode):
            return "lost_episodes", record_row("lost_episodes", record, stream, seq)
        return "samples", sample_row(record, stream, seq)

    def metric(self, subject: str, data: bytes, stream: str, seq: int) -> tuple[str, Row]:
        """A metric record -> its table (`train_steps`, `evals`, ...), by subject (`decode_metric`)."""
        return metric_row(decode_metric(subject, data), stream, seq)
