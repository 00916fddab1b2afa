"""Restart recovery: replay what a previous merger left unacked, in stream order.

Consumes nothing itself; the handlers feed it the first fetched batches after a start.

A merger holds the events of open episodes unacked. When it dies, the server redelivers them only
once their ack wait expires, and meanwhile it hands out newer events. Handled as they come, a newer
`llm` or `end` would precede its own episode's redelivered `begin` (dead-lettered as
unknown_episode: the episode lost). So at start, when the durable consumer reports unacked
messages, the merger buffers everything it fetches until each of those has come back (or the ack
wait plus a margin has passed: some may have been acked late), then handles the buffer sorted by
stream sequence: exactly the order a merger that never died would have seen.
"""

from __future__ import annotations

import logging
import time

from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo

log = logging.getLogger("swarmrl.merger")

MARGIN_S = 5.0
"""Slack for the server's redelivery timer after the ack wait has expired."""


class Recovery:
    """Buffers fetched messages until the previous incarnation's unacked ones are all redelivered."""

    def __init__(self, expected: int, barrier: int, ack_wait_s: float) -> None:
        self.expected = expected
        """How many messages were delivered but unacked when we started."""
        self.barrier = barrier
        """Highest stream sequence delivered before we started; redeliveries are at or below it."""
        self.deadline = time.monotonic() + ack_wait_s + MARGIN_S
        self.buffer: dict[int, Msg] = {}
        self.returned: set[int] = set()

    @classmethod
    def after_start(cls, info: ConsumerInfo, ack_wait_s: float) -> Recovery | None:
        """A recovery if the consumer has unacked messages, else None (a clean start)."""
        expected = info.num_ack_pending or 0
        if not expected:
            return None
        barrier = info.delivered.stream_seq if info.delivered else 0
        log.info(
            "recovering: %d unacked messages up to stream seq %d; buffering until they are redelivered",
            expected,
            barrier,
        )
        return cls(expected, barrier, ack_wait_s)

    def add(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            self.buffer[seq] = msg  # a second delivery replaces the first: ack the newest handle
            if seq <= self.barrier:
                self.returned.add(seq)

    def done(self) -> bool:
        if len(self.returned) >= self.expected:
            return True
        if time.monotonic() > self.deadline:
            log.warning(
                "recovery: only %d of %d unacked messages came back within the ack wait; going on",
                len(self.returned),
                self.expected,
            )
            return True
        return False

    def ordered(self) -> list[Msg]:
        log.info("recovered: handling %d buffered messages in stream order", len(self.buffer))
        return [self.buffer[seq] for seq in sorted(self.buffer)]
