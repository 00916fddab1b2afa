"""The ledger never acks past a message it has not handled: a fetch's reply that comes late (or not at
all, until its redelivery) in a network partition leaves a gap in the sequence, and the messages past
the gap wait for it (`StreamSink.early`, `Recorder.record`) instead of being written, and cumulatively acked, without it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.js.api import AckPolicy

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.recorder import Recorder
from swarmrl.services.ledger.service import Ledger
from tests.integration.test_ledger import publish_all
from tests.unit.ledger.factories import episode


async def test_messages_past_a_gap_wait_for_the_missing_ones(swarm_nats: NatsServer, tmp_path: Path) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    events = episode("e1", calls=2)  # begin, 2 llm calls, env, reward, end: 6 messages in order
    await publish_all(js, events)
    sub = await bus.durable_pull(js, S.EPISODES_STREAM, "test-order", ack_policy=AckPolicy.ALL)
    msgs = await sub.fetch(len(events), timeout=5)
    assert [m.metadata.sequence.stream for m in msgs] == list(range(1, len(events) + 1))
    ledger = Ledger(LedgerConfig(nats=swarm_nats.service_url, run_dir=tmp_path / "run"))
    ledger.dlq = bus.DeadLetters(nc, "ledger")
    sink = ledger.sinks[S.EPISODES_STREAM]
    recorder = Recorder(ledger, sink, sub, asyncio.Event(), ledger.ingest, ledger.writer)
    # the reply holding seqs 3 and 4 is late: 5 and 6 come first
    assert await recorder.record([msgs[0], msgs[1], msgs[4], msgs[5]])
    assert (sink.last_seq, sink.rows, sorted(sink.early)) == (2, 2, [5, 6])
    assert await recorder.record([msgs[3]])  # still one short: 4 waits too
    assert (sink.last_seq, sink.rows, sorted(sink.early)) == (2, 2, [4, 5, 6])
    assert await recorder.record([msgs[2]])  # the gap is filled: all in order
    assert (sink.last_seq, sink.rows, sink.early) == (6, 6, {})
    assert ledger.counts["held_for_order"] == 3 and ledger.counts["redelivered"] == 0
    assert await recorder.record([msgs[4]])  # its redelivery later is only a redelivery
    assert (sink.rows, ledger.counts["redelivered"]) == (6, 1)
    await nc.close()
