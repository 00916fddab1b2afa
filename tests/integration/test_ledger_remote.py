"""`swarmrl query --remote`: SQL answered by a running ledger (`swarmrl serve ledger`, as its own NATS
user) from its Parquet files, over NATS, from a directory that holds none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.common import bus
from tests.conftest import wait_for
from tests.integration.test_ledger import publish_all
from tests.unit.ledger.factories import episode


def query(server: NatsServer, sql: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"SWARMRL_NATS": server.service_url}
    cmd = [sys.executable, "-m", "swarmrl.cli", "query", "--remote", "--format", "json", sql]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(120)
async def test_a_query_over_nats_is_answered_from_the_ledgers_own_files(
    swarm_nats: NatsServer, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert query(swarm_nats, "SELECT 1", elsewhere).returncode == 1  # no ledger yet: it says so
    env = os.environ | {"SWARMRL_NATS": swarm_nats.url("ledger")}
    argv = [sys.executable, "-m", "swarmrl.cli", "serve", "ledger", "--run-dir", str(tmp_path / "run"),
            "--flush-interval-s", "0.1", "--nice", "0"]  # fmt: skip
    with open(tmp_path / "ledger.log", "wb") as log:  # noqa: ASYNC230  # a moment, before anything runs
        ledger = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
    try:
        nc = await bus.connect(swarm_nats.service_url, "test")
        await publish_all(nc.jetstream(), episode("e1", reward=0.5) + episode("e2", reward=1.0, end=False))
        await nc.close()

        def answered() -> list[dict[str, object]] | None:
            done = query(swarm_nats, "SELECT episode_id, status, reward FROM episodes ORDER BY 1", elsewhere)
            rows = json.loads(done.stdout) if done.returncode == 0 else []
            return rows if len(rows) == 2 else None

        rows = await wait_for(answered, timeout=60, interval=0.5, what="the ledger's answer over NATS")
        assert rows == [
            {"episode_id": "e1", "status": "ok", "reward": 0.5},
            {"episode_id": "e2", "status": "open", "reward": 1.0},
        ]
        refused = query(swarm_nats, "COPY (SELECT 1) TO 'x.csv'", elsewhere)
        assert refused.returncode == 1 and "reading statement" in refused.stderr
        assert not list(elsewhere.iterdir())  # nothing of the ledger came here but the answers
    finally:
        ledger.terminate()
        assert ledger.wait(timeout=60) == 0, (tmp_path / "ledger.log").read_text()[-2000:]
