"""One message of EPISODES, SAMPLES or METRICS -> `(table, row)`, or a dead-letter reason (pure logic).

Failures raise `Rejected` or the wire codec's `WireError`, whose text is `<code>: <detail>` (codes in
`lifecycle.DEAD_LETTER_CODES`). DLQ messages are recorded as they are (`tables.dead_letter_row`).
"""

from __future__ import annotations

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
from swarmrl.services.common.lifecycle import EpisodeTracker, episode_of
from swarmrl.services.ledger.tables import Row, event_row, lost_row, metric_row, sample_row


class Rejected(ValueError):
    """An input that breaks a rule beyond the wire contract (event ordering); `str()` is the reason."""


class Ingest:
    """Decodes and validates messages; owns the episode ordering state for EPISODES."""

    def __init__(self, tracker: EpisodeTracker | None = None, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.tracker = tracker or EpisodeTracker()
        self.max_event_bytes = max_event_bytes

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
        if subject.endswith(".lost"):
            lost = decode(data, LostEpisode)
            if subject != S.lost_subject(lost.model):
                raise WireError("subject", f"lost episode of model {lost.model} on subject {subject!r}")
            return "lost_episodes", lost_row(lost, stream, seq)
        record = decode(data, Sample)
        try:
            expected = S.samples_subject(record.model)
        except ValueError as exc:
            raise WireError("subject", str(exc)) from exc
        if subject != expected:
            raise WireError("subject", f"sample of model {record.model} on subject {subject!r}")
        return "samples", sample_row(record, stream, seq)

    def metric(self, subject: str, data: bytes, stream: str, seq: int) -> tuple[str, Row]:
        """A metric record -> its table (`train_steps`, `evals`, ...), by subject (`decode_metric`)."""
        return metric_row(decode_metric(subject, data), stream, seq)
