import pytest
from nats.aio.msg import Msg

from swarmrl.services.ledger import recorder as sink_module
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.recorder import StreamSink
from swarmrl.services.ledger.tables import dead_letter_row


def _msg(reply: str, data: bytes = b"x") -> Msg:
    return Msg(_client=None, subject="swarm.dlq.merger", reply=reply, data=data)  # type: ignore[arg-type]


def test_sink_flushes_on_rows_bytes_or_age_and_hands_over_its_buffers() -> None:
    cfg = LedgerConfig(flush_rows=2, flush_bytes=100, flush_interval_s=3600)
    sink = StreamSink("DLQ")
    assert not sink.due(cfg)
    row = dead_letter_row(
        subject="s", data=b"", service="m", original_subject="o", reason="r: x", ts=0.0, stream="DLQ", seq=1
    )
    first = _msg("$JS.ACK.DLQ.ledger-dlq.1.1.1.0.0")
    sink.add("dead_letters", row, first, 1)
    assert not sink.due(cfg) and sink.last is first and sink.last_seq == 1
    sink.add("dead_letters", row, _msg("$JS.ACK.DLQ.ledger-dlq.1.2.2.0.0"), 2)
    assert sink.due(cfg)
    buffers, rows = sink.take(cfg)
    assert rows == 2 and buffers["dead_letters"].rows == 2 and not sink.due(cfg)
    assert sink.last_seq == 2  # the position stays: it is acked after the write
    sink.add("dead_letters", row, _msg("$JS.ACK.DLQ.ledger-dlq.1.3.3.0.0", b"y" * 100), 3)
    assert sink.due(cfg)  # bytes bound
    sink.take(cfg)
    sink.add("dead_letters", row, _msg("$JS.ACK.DLQ.ledger-dlq.1.4.4.0.0"), 4)
    assert sink.due(LedgerConfig(flush_interval_s=0.0))  # age bound


def test_an_idle_stream_writes_enough_rows_or_a_bursts_tail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(sink_module.time, "monotonic", lambda: clock[0])
    cfg = LedgerConfig(flush_rows=3, flush_idle_rows=2, flush_interval_s=10)
    sink = StreamSink("DLQ")
    row = dead_letter_row(
        subject="s", data=b"", service="m", original_subject="o", reason="r: x", ts=0.0, stream="DLQ", seq=1
    )
    seq = iter(range(1, 100))

    def add() -> None:
        n = next(seq)
        sink.add("dead_letters", row, _msg(f"$JS.ACK.DLQ.ledger-dlq.1.{n}.{n}.0.0"), n)

    add()
    assert not sink.due(cfg, idle=True)  # a trickle: one row waits for the age bound
    add()
    assert sink.due(cfg, idle=True) and not sink.due(cfg)
    sink.take(cfg)  # 2 rows: as many as an idle write needs, so the stream is busy
    add()
    assert sink.due(cfg, idle=True) and not sink.due(cfg)  # the tail of a busy stream goes at once
    sink.take(cfg)  # a small write (1 row) ...
    clock[0] += 1
    add()
    assert sink.due(cfg, idle=True)  # ... does not end the burst: its last rows still go at once
    sink.take(cfg)
    clock[0] += 20  # no large write for longer than flush_interval_s: a trickle again
    add()
    assert not sink.due(cfg, idle=True)
    clock[0] += 10
    assert sink.due(cfg)  # the age bound
    for _ in range(2):
        add()
    assert sink.due(cfg)  # a full write
    sink.take(cfg)
    add()
    assert sink.due(cfg, idle=True)  # the burst's tail goes at once
