"""`swarmrl serve ledger` lowers its CPU priority (`LedgerConfig.nice`), writer threads included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from tests.conftest import wait_for
from tests.integration.test_ledger import count, publish_all
from tests.unit.ledger.factories import episode

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="reads thread niceness from /proc"
)


def niceness(pid: int) -> dict[int, int]:
    """The niceness of each thread of process `pid` (field 19 of /proc/<pid>/task/<tid>/stat)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[int(task.name)] = int(fields[16])
    return out


@pytest.mark.parametrize(("flag", "expected"), [([], 10), (["--nice", "3"], 3)])
async def test_the_ledger_and_its_writer_threads_run_at_its_niceness(
    swarm_nats: NatsServer, js: JetStreamContext, tmp_path: Path, flag: list[str], expected: int
) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "swarmrl.cli", "serve", "ledger", "--run-dir", str(run_dir), *flag]
    env = os.environ | {"SWARMRL_NATS": swarm_nats.service_url, "SWARMRL_FLUSH_INTERVAL_S": "0.05"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)  # noqa: ASYNC220
    try:
        events = episode("nice", calls=1)
        await publish_all(js, events)
        # Rows on disk: the writes ran in the ledger's worker threads, which exist by now.
        await wait_for(
            lambda: (
                (run_dir / "ledger" / "events").is_dir()
                and count(run_dir, "SELECT count(*) FROM events")
                + count(run_dir, "SELECT count(*) FROM llm_calls")
                == len(events)
            ),
            timeout=60,
            what="the episode written by the ledger process",
        )
        threads = niceness(proc.pid)
        assert threads[proc.pid] == expected  # the main thread: decoding, acks
        # Threads started after the priority was lowered inherit it (the writer threads among them);
        # threads some import started before it (an idle BLAS pool) keep theirs.
        assert sum(nice == expected for nice in threads.values()) >= 2, threads
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert f"ledger at niceness {expected}" in err, err[-2000:]
