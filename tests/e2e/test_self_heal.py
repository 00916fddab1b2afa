"""`swarmrl up` heals itself: the merger and the embedded nats-server are SIGKILLed mid-run, `up`
restarts them (the broker on its own store and port), every other service rides out the broker
restart, and the run trains on to its step budget without losing or doubling a sample."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmrl.report import restart_counts
from swarmrl.services.ledger.query import connect
from tests.e2e.test_up import _assert_no_orphans, _up


def _pids(run_dir: Path) -> dict[str, int]:
    try:
        return dict(json.loads((run_dir / "pids.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being rewritten
        return {}


class Up:
    """A running `swarmrl up` whose output is read as it comes (a full pipe would block it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc, self.out = proc, bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out += line

    def text(self) -> str:
        return self.out.decode(errors="replace")

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll `cond` until true (returns the seconds it took); fail with up's output if up exits first."""
        start = time.monotonic()
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"up exited ({self.proc.returncode}) waiting for {what}:\n{self.text()[-3000:]}")
            if time.monotonic() - start > timeout:
                pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{self.text()[-3000:]}")
            time.sleep(0.1)
        return time.monotonic() - start

    def kill_and_wait_restart(self, run_dir: Path, name: str) -> float:
        """SIGKILL `name`; returns the seconds until up has started it again (pids.json has a new pid)."""
        old = _pids(run_dir)[name]
        os.kill(old, signal.SIGKILL)
        return self.wait(lambda: _pids(run_dir).get(name, old) != old, 60, f"{name} to be restarted")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_up_survives_a_killed_merger_and_a_killed_nats_server(tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    up = Up(_up(run_dir, tiny_model_dir, "--steps", "3", "--minutes", "15", "--eval-every", "100"))
    proc = up.proc
    try:
        # Kill once training is under way: the first checkpoint is on disk, samples are in flight.
        up.wait(lambda: (run_dir / "checkpoints" / "policy" / "step-1").exists(), 600, "trainer step 1")
        killed_at = time.time()
        merger_back = up.kill_and_wait_restart(run_dir, "merger")
        nats_back = up.kill_and_wait_restart(run_dir, "nats")  # while the merger is still recovering
        proc.wait(timeout=900)
        up.reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = up.text()
    assert proc.returncode == 0, text[-3000:]
    assert "a trainer finished: policy step 3" in text, text[-3000:]
    assert "merger exited (exit code -9); restart attempt 1 in 1s" in text, text[-3000:]
    assert "nats exited (exit code -9); restart attempt 1 in 1s" in text, text[-3000:]
    print(f"restarted: merger after {merger_back:.1f}s, nats after {nats_back:.1f}s")
    _assert_no_orphans(run_dir)
    # The other services reconnected through the broker restart instead of dying.
    assert restart_counts(run_dir) == {"merger": 1, "nats": 1}
    assert "- restarts: merger 1, nats 1" in (run_dir / "report.md").read_text()

    con = connect(run_dir)
    after = con.execute("SELECT count(*) FROM train_steps WHERE ts > ?", [killed_at]).fetchone()[0]
    assert after >= 1, "no trainer step after the kills"
    assert con.execute("SELECT count(*) - count(DISTINCT step) FROM train_steps").fetchone()[0] == 0
    assert con.execute("SELECT count(*) - count(DISTINCT sample_id) FROM samples").fetchone()[0] == 0
    # Every episode the merger finished, before or after its restart: its samples exactly once, and
    # every token the model generated in it trained exactly once.
    rows = con.execute("""
        SELECT e.episode_id, m.status, m.timelines_kept,
               (SELECT count(*) FROM samples s WHERE s.episode_id = e.episode_id),
               (SELECT coalesce(sum(list_sum(s.loss_mask)), 0) FROM samples s WHERE s.episode_id = e.episode_id),
               (SELECT coalesce(sum(len(c.output_ids)), 0) FROM llm_calls c WHERE c.episode_id = e.episode_id)
        FROM episodes e JOIN merges m USING (episode_id) WHERE NOT e.eval AND e.status = 'ok'
    """).fetchall()
    assert rows
    for eid, merge_status, kept, n_samples, trained, generated in rows:
        assert merge_status == "merged" and n_samples == kept >= 1, eid
        assert trained == generated, f"{eid}: {trained} trained tokens, {generated} generated"
    assert con.execute("SELECT count(*) - count(DISTINCT episode_id) FROM merges").fetchone()[0] == 0
