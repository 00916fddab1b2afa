"""Live code iteration end to end: `swarmrl clients restart` replaces a task's clients while `swarmrl up`
trains, and the ledger accounts for every episode of both generations exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarmrl.services.ledger.query import connect
from tests.e2e.test_up import _alive, _assert_no_orphans, _up

TASK = "guess_number"


def _wait(proc: subprocess.Popen[bytes], what: str, check: Callable[[], Any], timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"swarmrl up exited while waiting for {what}:\n{proc.stdout.read().decode()[-3000:]}")  # type: ignore[union-attr]
        try:
            if value := check():
                return value
        except Exception:  # noqa: BLE001 - the ledger's files appear while we read them
            pass
        time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}:\n{out.decode()[-3000:]}")


def _ended(run_dir: Path, version: str | None = None) -> int:
    sql = "SELECT count(*) FROM episodes WHERE status = 'ok' AND NOT eval"
    if version is None:
        return int(connect(run_dir).execute(sql).fetchone()[0])  # type: ignore[index]
    return int(connect(run_dir).execute(sql + " AND client_version = ?", [version]).fetchone()[0])  # type: ignore[index]


# ~50 s on 2 shared cores, and the restart alone may take up to 45 s by design: `slow`.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restart_replaces_clients_and_every_episode_is_accounted_exactly_once(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    started = time.monotonic()
    run_dir = tmp_path / "run"
    proc = _up(run_dir, tiny_model_dir, "--steps", "1000", "--minutes", "12", "--abort-rate", "0.1",
               "--eval-every", "1000")  # fmt: skip
    _wait(proc, "the first ended episodes", lambda: _ended(run_dir) >= 4)
    old_pids = {
        n: p for n, p in json.loads((run_dir / "pids.json").read_text()).items() if n.startswith("client")
    }
    assert list(old_pids) == [f"client-{TASK}-0"], old_pids
    old_pid = old_pids[f"client-{TASK}-0"]

    restart = subprocess.run(
        [sys.executable, "-m", "swarmrl.cli", "clients", "restart", TASK, "--version", "v2", "--run-dir", str(run_dir)],
        capture_output=True, timeout=200, cwd=tmp_path,
    )  # fmt: skip
    assert restart.returncode == 0, restart.stderr.decode() + restart.stdout.decode()
    said = restart.stdout.decode()
    assert f"replaced {TASK} clients client-{TASK}-0 " in said and f"client-{TASK}-0-g1" in said, said
    assert not _alive(old_pid), "the old generation's client is still running"
    pids = json.loads((run_dir / "pids.json").read_text())
    assert f"client-{TASK}-0" not in pids and _alive(pids[f"client-{TASK}-0-g1"]), pids
    # every other process kept running through the restart
    assert all(_alive(p) for n, p in pids.items()), pids

    unknown = subprocess.run(
        [sys.executable, "-m", "swarmrl.cli", "clients", "restart", "nope", "--run-dir", str(run_dir)],
        capture_output=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert unknown.returncode == 1 and b"unknown task 'nope'; tasks: ['guess_number']" in unknown.stderr

    _wait(proc, "episodes of client version v2", lambda: _ended(run_dir, "v2") >= 4)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert b"stopped (interrupted)" in out and b"unexpectedly" not in out, out.decode()[-3000:]
    _assert_no_orphans(run_dir)
    assert not _alive(old_pid)

    con = connect(run_dir)
    versions = dict(
        con.execute("SELECT client_version, count(*) FROM episodes WHERE NOT eval GROUP BY ALL").fetchall()
    )
    old_versions = set(versions) - {"v2"}
    assert "v2" in versions and len(old_versions) == 1, versions
    assert next(iter(old_versions)).startswith("sha1-"), versions  # the built-in client code hash
    # Every begun training episode has exactly one terminal event: ended or aborted, never both, never open.
    terminals = con.execute("""
        SELECT episode_id, client_version, count(*) FILTER (WHERE kind IN ('end', 'abort'))
        FROM events WHERE episode_id IN (SELECT episode_id FROM events WHERE kind = 'begin' AND NOT eval)
        GROUP BY ALL HAVING count(*) FILTER (WHERE kind IN ('end', 'abort')) != 1
    """).fetchall()
    assert terminals == [], f"episodes without exactly one end/abort: {terminals[:10]}"
    dup = con.execute("SELECT count(*) - count(DISTINCT sample_id) FROM samples").fetchone()[0]  # type: ignore[index]
    assert dup == 0, "a sample was published twice"
    merges = con.execute("""
        SELECT e.episode_id, e.client_version, e.status, m.status, m.timelines_kept,
               (SELECT count(*) FROM samples s WHERE s.episode_id = e.episode_id)
        FROM episodes e LEFT JOIN merges m USING (episode_id) WHERE NOT e.eval
    """).fetchall()
    for eid, version, status, merge_status, kept, n_samples in merges:
        if status == "ok" and merge_status is not None:
            assert merge_status == "merged" and n_samples == kept >= 1, (
                eid,
                version,
                merge_status,
                kept,
                n_samples,
            )
        elif status == "aborted":
            assert merge_status in (None, "aborted") and n_samples == 0, (
                eid,
                version,
                merge_status,
                n_samples,
            )
    # The old generation was drained while the swarm ran: the merger had all the time it needed for it.
    old_ended = [r for r in merges if r[1] in old_versions and r[2] == "ok"]
    assert old_ended and all(r[3] == "merged" for r in old_ended), [r for r in old_ended if r[3] != "merged"]
    report = (run_dir / "report.md").read_text()
    assert "## Client versions" in report and "| `v2` |" in report, report
    print(f"live replace e2e: {time.monotonic() - started:.0f}s, episodes by version {versions}")
