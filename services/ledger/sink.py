"""What one stream's consumer holds between flushes: buffered rows and the position they cover (no I/O)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from swarmrl.services.ledger.columns import TableBuffer
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.tables import Row


@dataclass
class StreamSink:
    """Rows of one stream waiting for their flush, and the message whose ack will cover them (acks
    are cumulative, `AckPolicy.ALL`, and messages are handled strictly in stream order)."""

    stream: str
    sourced: bool = False
    """A partition of LEDGER_PARTS (ledger replicas): sequences are EPISODES' (`bus.source_seq`), and
    each message is acked once its row is durable (a work queue takes no cumulative acks)."""
    owned: Callable[[], bool] | None = None
    """Replicas: whether the partition's lease is still ours (a flush is dropped unwritten if not)."""
    covered: list[Msg] = field(default_factory=list)
    """Sourced: the buffered messages, acked after their flush."""
    durable_seq: int = 0
    """Every message of the stream up to this sequence is on disk or dead-lettered."""
    last_seq: int = 0
    """Every message up to this sequence is handled: buffered, on disk or dead-lettered."""
    last: Msg | None = None
    """The message at `last_seq` if not yet acked (its ack acks everything before it)."""
    early: dict[int, Msg] = field(default_factory=dict)
    """Not sourced: messages that came before one they follow (a fetch's reply late or lost in the
    network), held by sequence until the gap is filled (by the late reply, or its redelivery)."""
    writing: asyncio.Task[None] | None = None
    """The write of the previous buffers, while in progress."""
    buffers: dict[str, TableBuffer] = field(default_factory=dict)
    rows: int = 0
    nbytes: int = 0
    first_at: float = 0.0
    large_at: float = float("-inf")
    """When the last large write was taken (`flush_idle_rows` rows or `flush_bytes`): a burst."""

    def add(self, table: str, row: Row, msg: Msg, seq: int) -> None:
        if not self.rows:
            self.first_at = time.monotonic()
        if table not in self.buffers:
            self.buffers[table] = TableBuffer(table)
        self.buffers[table].append(row)
        self.rows += 1
        self.nbytes += len(msg.data)
        self.last, self.last_seq = msg, seq
        if self.sourced:
            self.covered.append(msg)

    def take_acks(self) -> list[Msg]:
        """The messages whose acks the next flush owns: each buffered one (sourced), else the latest."""
        acks = self.covered if self.sourced else [m for m in (self.last,) if m is not None]
        self.covered, self.last = [], None
        return acks

    def due(self, cfg: LedgerConfig, idle: bool = False) -> bool:
        """Time to write: `flush_rows` or `flush_bytes` waiting, or rows `flush_interval_s` old; or,
        `idle` (a poll found nothing new), `flush_idle_rows` waiting or the tail of a burst."""
        if not self.rows:
            return False
        if self.rows >= cfg.flush_rows or self.nbytes >= cfg.flush_bytes:
            return True
        now = time.monotonic()
        if now - self.first_at >= cfg.flush_interval_s:
            return True
        burst = now - self.large_at < cfg.flush_interval_s
        return idle and (burst or self.rows >= cfg.flush_idle_rows)

    def take(self, cfg: LedgerConfig) -> tuple[dict[str, TableBuffer], int]:
        """Hand over the buffers and their row count; start afresh."""
        taken = self.buffers, self.rows
        if self.rows >= min(cfg.flush_idle_rows, cfg.flush_rows) or self.nbytes >= cfg.flush_bytes:
            self.large_at = time.monotonic()
        self.buffers, self.rows, self.nbytes = {}, 0, 0
        return taken
