"""A stopped ledger has recorded what the streams held when the stop came (`swarmrl up` stops it last)."""

from __future__ import annotations

from pathlib import Path

from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.handlers import Ledger
from tests.conftest import wait_for
from tests.integration.test_ledger import count, publish_all
from tests.unit.ledger.factories import episode


async def test_stop_takes_what_the_stream_held(
    swarm_nats: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # A long poll interval: right after its first write the ledger sleeps, caught up, for 3 s; the
    # last episodes and the stop come then (without the drain on stop they were never recorded).
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
