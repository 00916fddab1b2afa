"""`swarmrl up` end to end: real processes (NATS, engine, gateway, merger, trainer, ledger, clients)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmrl.services.ledger.query import connect


def _up(run_dir: Path, model: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "swarmrl.cli",
        "up",
        "--model",
        str(model),
        "--run-dir",
        str(run_dir),
        "--no-display",
        "--clients",
        "1",
        "--concurrency",
        "2",
        "--num-repeat",
        "4",
        "--batch-groups",
        "1",
        "--max-tokens",
        "6",
        "--eval-limit",
        "2",
        "--eval-samples",
        "1",
        # guess_number: a random-init model still wins some games by luck, so groups have a reward
        # spread and the trainer takes steps; on calculator it would score 0 everywhere.
        "--task",
        "guess_number",
        *extra,
    ]
    return subprocess.Popen(cmd, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _assert_no_orphans(run_dir: Path) -> None:
    pids = json.loads((run_dir / "pids.json").read_text())
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [n for n, p in pids.items() if _alive(p)], "processes left running after up stopped"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_up_trains_and_each_ended_episode_yields_its_samples_exactly_once(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = _up(
        run_dir,
        tiny_model_dir,
        "--steps",
        "2",
        "--minutes",
        "8",
        "--abort-rate",
        "0.1",
        "--eval-every",
        "100",
        # What is checked here is accounting, not learning: any complete group is trained (a step
        # whose loss is 0 when every reward is equal), so the steps do not wait for a lucky group
        # (on a slow CI machine the first step once took 7 minutes).
        "--trainer-arg=--no-skip-zero-adv-groups",
    )
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert b"a trainer finished: policy step 2" in out, out.decode()[-3000:]
    _assert_no_orphans(run_dir)
    assert (run_dir / "report.md").exists() and (run_dir / "curves.png").stat().st_size > 0

    con = connect(run_dir)
    assert con.execute("SELECT count(*) FROM train_steps").fetchone()[0] >= 2
    dup = con.execute("SELECT count(*) - count(DISTINCT sample_id) FROM samples").fetchone()[0]
    assert dup == 0, "a sample was published twice"
    # Every episode the merger finished: samples exactly as many as it kept, and every token the
    # model generated in the episode is trained exactly once.
    rows = con.execute("""
        SELECT e.episode_id, e.status, m.status, m.timelines_kept,
               (SELECT count(*) FROM samples s WHERE s.episode_id = e.episode_id),
               (SELECT coalesce(sum(list_sum(s.loss_mask)), 0) FROM samples s WHERE s.episode_id = e.episode_id),
               (SELECT coalesce(sum(len(c.output_ids)), 0) FROM llm_calls c WHERE c.episode_id = e.episode_id)
        FROM episodes e JOIN merges m USING (episode_id) WHERE NOT e.eval
    """).fetchall()
    ended = [r for r in rows if r[1] == "ok"]
    aborted = [r for r in rows if r[1] == "aborted"]
    assert ended and aborted, f"expected both ended and aborted episodes, got {len(ended)} / {len(aborted)}"
    for eid, _, merge_status, kept, n_samples, trained, generated in ended:
        assert merge_status == "merged" and n_samples == kept >= 1, eid
        assert trained == generated, f"{eid}: {trained} trained tokens, {generated} generated"
    for eid, _, merge_status, _, n_samples, _, _ in aborted:
        assert merge_status == "aborted" and n_samples == 0, eid


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_stops_everything_cleanly(tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _up(run_dir, tiny_model_dir, "--steps", "1000", "--minutes", "10")
    deadline = time.monotonic() + 300
    while not (run_dir / "ledger" / "llm_calls").exists() and time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(proc.stdout.read().decode()[-3000:])
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert b"stopped (interrupted)" in out
    _assert_no_orphans(run_dir)
    assert (run_dir / "report.md").exists()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_stopped_run_resumes_from_its_last_version(tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    pytest.importorskip("tensorboard", reason="the tracker's TensorBoard export: pip install -e '.[track]'")
    first = _up(run_dir, tiny_model_dir, "--steps", "2", "--minutes", "8", "--eval-every", "100",
                "--trainer-arg=--no-skip-zero-adv-groups", "--track", "tensorboard")  # fmt: skip
    out, _ = first.communicate(timeout=900)
    assert first.returncode == 0 and b"a trainer finished: policy step 2" in out, out.decode()[-3000:]

    cmd = [sys.executable, "-m", "swarmrl.cli", "up", "--resume", str(run_dir), "--no-display"]
    again = subprocess.run([*cmd], cwd=tmp_path, capture_output=True, timeout=120)  # steps all spent
    assert (
        again.returncode == 2 and b"trained policy to step 2 of its 2: give --steps above 2" in again.stderr
    )
    resumed = subprocess.run(
        [*cmd, "--steps", "4", "--minutes", "8"], cwd=tmp_path, capture_output=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stdout.decode()[-3000:]
    assert b"a trainer finished: policy step 4" in resumed.stdout, resumed.stdout.decode()[-3000:]
    _assert_no_orphans(run_dir)

    con = connect(run_dir)
    # The trainer went on from its checkpoint (steps 3 and 4, not 1 and 2 again), the engine served
    # the resumed version, and the one ledger holds both parts, each sample once.
    assert [r[0] for r in con.execute("SELECT step FROM train_steps ORDER BY step").fetchall()] == [
        1,
        2,
        3,
        4,
    ]
    parts = [json.loads(line) for line in (run_dir / "parts.jsonl").read_text().splitlines()]
    assert [p["resumed"] for p in parts] == [False, True] and parts[0]["ended"] <= parts[1]["started"]
    versions = con.execute(
        "SELECT min(policy_version) FROM llm_calls WHERE ts > ?", [parts[1]["started"]]
    ).fetchone()[0]
    assert versions is not None and versions >= 2
    assert con.execute("SELECT count(*) - count(DISTINCT sample_id) FROM samples").fetchone()[0] == 0
    assert "- parts: 2 (`swarmrl up --resume`)" in (run_dir / "report.md").read_text()
    # The tracker went on too: one TensorBoard curve over both parts, every step once.
    from tests.unit.tracker.readers import tensorboard_points

    losses = tensorboard_points(run_dir / "track" / "tensorboard")["train/policy/loss"]
    assert [step for step, _ in losses] == [1, 2, 3, 4]
