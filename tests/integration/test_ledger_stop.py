"""A stopped ledger has recorded what the streams held when the stop came (`swarmrl up` stops it last)."""

from __future__ import annotations

from pathlib import Path

from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.service import Ledger
from tests.conftest import wait_for
from tests.integration.test_ledger import count, publish_all
from tests.unit.ledger.factories import episode


async def test_stop_takes_what_the_stream_held(
    swarm_nats: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # A long poll interval: whatever the ledger has not read yet when the stop comes (it waits up to
    # 3 s between looks at a stream it is caught up with) must still be read, written and acked.
    cfg = LedgerConfig(nats=swarm_nats.service_url, run_dir=run_dir, flush_interval_s=0.05, poll_interval_s=3)
    await publish_all(js, episode("early", calls=1))
    ledger = Ledger(cfg)
    await ledger.start()
    await wait_for(lambda: ledger.counts["events"] >= 4, timeout=20, what="the first episode written")
    late = episode("late1", calls=2) + episode("late2", calls=1)
    await publish_all(js, late)
    await ledger.stop()
    assert count(run_dir, "SELECT count(*) FROM events") + count(
        run_dir, "SELECT count(*) FROM llm_calls"
    ) == (len(episode("early", calls=1)) + len(late))
    assert count(run_dir, "SELECT count(*) FROM episodes WHERE status = 'ok'") == 3


async def test_a_burst_is_written_once_the_ledger_has_caught_up(
    swarm_nats: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    """Neither the row bound nor the age bound is reached: the rows are written (and acked) when a
    poll finds nothing new, not `flush_interval_s` later."""
    run_dir = tmp_path / "run"
    cfg = LedgerConfig(
        nats=swarm_nats.service_url,
        run_dir=run_dir,
        flush_rows=10**6,
        flush_interval_s=3600,
        flush_idle_rows=10,
        poll_interval_s=0.05,
    )
    ledger = Ledger(cfg)
    await ledger.start()
    try:
        burst = episode("b1", calls=2) + episode("b2", calls=1)
        await publish_all(js, burst)
        await wait_for(
            lambda: ledger.counts["events"] + ledger.counts["llm_calls"] == len(burst),
            what="the burst written",
        )
        info = await js.consumer_info(S.EPISODES_STREAM, S.durable_name("ledger", S.EPISODES_STREAM))
        await wait_for(lambda: ledger.sinks[S.EPISODES_STREAM].durable_seq == info.delivered.stream_seq)
    finally:
        await ledger.stop()
    assert count(run_dir, "SELECT count(*) FROM episodes WHERE status = 'ok'") == 2
