"""A ledger consumer's retries (`Recorder`): a write that fails for the disk, and a dead letter the DLQ
does not take, are tried again until they succeed; once stopped they give up and leave the messages
unacked, for redelivery."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.ingest import Ingest
from swarmrl.services.ledger.recorder import Recorder, StreamSink
from swarmrl.services.ledger.tables import dead_letter_row


class Message:  # what the recorder uses of a JetStream message
    subject, data = "swarm.dlq.merger", b"x"

    def __init__(self) -> None:
        self.acked = 0

    async def ack(self) -> None:
        self.acked += 1


class Flaky:
    """Fails its first `failures` calls with `error`, then does what `then` does."""

    def __init__(self, failures: int, error: Exception, then: Any = None) -> None:
        self.failures, self.error, self.then, self.calls = failures, error, then, 0

    def write_group(self, tables: dict, commit: Any = None) -> list:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return list(tables)

    async def send(self, msg: Any, reason: str) -> None:
        self.write_group({})


def recorder(writer: Any = None, dlq: Any = None) -> tuple[Recorder, StreamSink]:
    ledger = SimpleNamespace(
        cfg=LedgerConfig(), dlq=dlq or Flaky(0, OSError()), counts=Counter(), fetched=Counter()
    )
    sink = StreamSink("DLQ")
    return Recorder(ledger, sink, None, asyncio.Event(), Ingest(), writer or Flaky(0, OSError())), sink  # type: ignore[arg-type]


def buffered(sink: StreamSink) -> Message:
    row = dead_letter_row(
        subject="s", data=b"", service="m", original_subject="o", reason="r: x", ts=0.0, stream="DLQ", seq=1
    )
    msg = Message()
    sink.add("dead_letters", row, msg, 1)  # type: ignore[arg-type]
    return msg


def test_a_write_the_disk_refused_is_retried_then_acked() -> None:
    async def main() -> None:
        writer = Flaky(2, OSError("No space left on device"))
        rec, sink = recorder(writer)
        msg = buffered(sink)
        await rec.start_flush()
        await rec.finish_flush()
        assert writer.calls == 3 and msg.acked == 1 and sink.durable_seq == 1
        assert rec.counts["dead_letters"] == 1

    asyncio.run(main())


def test_a_stopped_recorder_gives_up_a_failing_write_and_acks_nothing() -> None:
    async def main() -> None:
        rec, sink = recorder(Flaky(100, OSError("No space left on device")))
        msg = buffered(sink)
        rec.stop.set()
        await rec.start_flush()
        with pytest.raises(OSError, match="No space"):
            await rec.finish_flush()
        assert msg.acked == 0 and sink.durable_seq == 0

    asyncio.run(main())


def test_a_dead_letter_is_retried_until_the_dlq_takes_it_or_the_recorder_stops() -> None:
    async def main() -> None:
        dlq = Flaky(2, ConnectionError("dlq away"))
        rec, _ = recorder(dlq=dlq)
        assert await rec.dead_letter(Message(), "malformed: x") and dlq.calls == 3  # type: ignore[arg-type]
        rec, _ = recorder(dlq=Flaky(100, ConnectionError("dlq away")))
        rec.stop.set()
        assert not await rec.dead_letter(Message(), "malformed: x")  # type: ignore[arg-type]

    asyncio.run(main())
