"""`swarmrl research` end to end with a stand-in for `swarmrl up` (research_fake_up.py, seconds a run):
the run loop, early stopping, failures, report, shared NATS, and resume after a real `kill -9`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmrl.infra.nats_server import NatsServer
from swarmrl.research.accounts import RunAccounts
from swarmrl.research.cli import render
from swarmrl.research.state import load

FAKE = Path(__file__).with_name("research_fake_up.py")
STUDY = """
name = "fake"
question = "Does the learning rate matter to the fake?"
seeds = [1, 2]
[baseline]
name = "lr-1e-4"
flags = {{ lr = 1e-4 }}
[arms.lr-3e-4]
flags = {{ lr = 3e-4 }}
[arms.{third}]
flags = {{ lr = {third_lr} }}
[metric]
use = "final_success"
[budget]
run_minutes = 1
{extra}
"""


def research(tmp_path: Path, *args: str, seconds: float = 0.2, **env: str) -> subprocess.Popen[str]:
    full_env = os.environ | {
        "FAKE_UP_SECONDS": str(seconds),
        "FAKE_UP_LOG": str(tmp_path / "fake.log"),
        **env,
    }
    cmd = [sys.executable, "-m", "swarmrl.cli", "research", *args, "--up-command", f"{sys.executable} {FAKE}"]
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def state(study_dir: Path) -> dict:
    path = study_dir / "state.json"
    return json.loads(path.read_text()) if path.exists() else {"runs": {}, "decisions": []}


def wait_state(study_dir: Path, predicate, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = state(study_dir)
        if predicate(st):
            return st
        time.sleep(0.05)
    raise AssertionError(f"state never matched; last: {json.dumps(state(study_dir))[:2000]}")


def fake_log(tmp_path: Path) -> list[str]:
    path = tmp_path / "fake.log"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_study_runs_retries_failures_and_reports(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(third="broken", third_lr="5e-4", extra=""))
    proc = research(
        tmp_path, str(study), "--dir", str(tmp_path / "out"), "--parallel", "2", FAKE_UP_FAIL_LR="5e-4"
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out  # some runs failed
    runs = state(tmp_path / "out")["runs"]
    assert {rid: r["status"] for rid, r in runs.items()} == {
        "lr-1e-4-s1": "done", "lr-3e-4-s1": "done", "broken-s1": "failed",
        "lr-1e-4-s2": "done", "lr-3e-4-s2": "done", "broken-s2": "failed",
    }  # fmt: skip
    assert len(runs["broken-s1"]["attempts"]) == 2 and runs["broken-s1"]["note"].startswith("failed: exit 1")
    assert (tmp_path / "out" / "runs" / "broken-s1.attempt1" / "up.out").exists()
    # success = 0.3 + 1000 * lr + 0.01 * seed at the last version
    assert runs["lr-3e-4-s2"]["metric"] == pytest.approx(0.62)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| lr-3e-4 | 2 | 0.615 | [0.610, 0.620] | +0.200 | [+0.190, +0.210] | 0.333 |" in report
    assert "`broken`: 2 run(s) gave no metric" in report
    assert (
        f"swarmrl up --lr 0.0003 --minutes 1 --seed 2 --run-dir {tmp_path / 'out' / 'runs' / 'lr-3e-4-s2'}"
        in report
    )
    assert (tmp_path / "out" / "forest.png").stat().st_size > 0 and (tmp_path / "out" / "curves.png").exists()
    status = render(tmp_path / "out", load(tmp_path / "out"))  # `swarmrl research status DIR`
    assert "state: finished; 4 done, 2 failed of 6 runs" in status


def test_kill_9_then_resume(tmp_path: Path) -> None:
    """Killed while the second seed runs, after early stopping dropped an arm: the resumed study
    redoes no finished run, restarts the interrupted one (and says so), and keeps the decision."""
    study = tmp_path / "study.toml"
    study.write_text(
        STUDY.format(third="lr-3e-5", third_lr="3e-5", extra="[early_stop]\nafter_seeds = [1]\n")
    )
    out = tmp_path / "out"
    proc = research(tmp_path, str(study), "--dir", str(out), seconds=0.6)
    up_out = out / "runs" / "lr-1e-4-s2" / "up.out"
    st = wait_state(
        out,
        lambda s: (
            ([{}] + s["runs"].get("lr-1e-4-s2", {}).get("attempts", []))[-1].get("pid")
            and up_out.exists()
            and "step 3/10" in up_out.read_text()
        ),  # mid-run: it has reported progress
    )
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert st["decisions"][0]["stopped"] == ["lr-3e-5"] and st["runs"]["lr-3e-5-s2"]["status"] == "halved"
    pid = st["runs"]["lr-1e-4-s2"]["attempts"][-1]["pid"]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:  # its parent-death SIGTERM
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert state(out)["runs"]["lr-1e-4-s2"]["status"] == "running"
    before = {rid: r["attempts"] for rid, r in state(out)["runs"].items() if r["status"] == "done"}
    assert sorted(before) == ["lr-1e-4-s1", "lr-3e-4-s1", "lr-3e-5-s1"]

    proc = research(tmp_path, "--resume", str(out))
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    assert "lr-1e-4-s2 was interrupted (attempt 1" in log and "restarts from the beginning" in log
    final = state(out)
    assert all(final["runs"][rid]["attempts"] == attempts for rid, attempts in before.items())  # never redone
    assert final["decisions"] == st["decisions"] and final["runs"]["lr-3e-5-s2"]["status"] == "halved"
    assert [a["outcome"].split(":")[0] for a in final["runs"]["lr-1e-4-s2"]["attempts"]] == [
        "interrupted",
        "finished",
    ]
    assert (out / "runs" / "lr-1e-4-s2.attempt1").is_dir()
    started = fake_log(tmp_path)
    assert sorted(started) == sorted(
        ["lr-1e-4-s1", "lr-3e-4-s1", "lr-3e-5-s1", "lr-1e-4-s2", "lr-1e-4-s2", "lr-3e-4-s2"]
    )
    assert (
        "- after 1 seed(s): lr-3e-4 0.610, lr-3e-5 0.340; kept ['lr-3e-4'], stopped ['lr-3e-5']"
        in (out / "report.md").read_text()
    )


def test_parallel_runs_on_one_shared_server(tmp_path: Path, nats_server: NatsServer) -> None:
    """Two runs at once on one nats-server, each in its own accounts: each sees only its own message."""
    study = tmp_path / "study.toml"
    study.write_text(
        STUDY.format(third="lr-3e-5", third_lr="3e-5", extra="").replace("seeds = [1, 2]", "seeds = [1]")
    )
    proc = research(tmp_path, str(study), "--dir", str(tmp_path / "out"), "--parallel", "3", "--nats",
                    nats_server.plain_url, "--nats-conf", str(nats_server.conf_dir), seconds=1.0)  # fmt: skip
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    lines = (tmp_path / "fake.log").read_text().splitlines()
    assert sorted(lines) == ["lr-1e-4-s1 1 metrics=1", "lr-3e-4-s1 1 metrics=1", "lr-3e-5-s1 1 metrics=1"]
    assert RunAccounts(nats_server.conf_dir).keys() == []  # every run's accounts removed after it
    accounts = [a["account"] for r in state(tmp_path / "out")["runs"].values() for a in r["attempts"]]
    assert len(set(accounts)) == 3


def test_more_seeds_extends_a_finished_study(tmp_path: Path) -> None:
    """`--resume DIR --more-seeds 1` on a finished study: every kept arm runs seed 3, no finished run
    is redone, an arm early stopping dropped gets no new run, and the report counts three seeds."""
    study = tmp_path / "study.toml"
    extra = "total_minutes = 4\n[early_stop]\nafter_seeds = [1]\n"
    study.write_text(STUDY.format(third="lr-3e-5", third_lr="3e-5", extra=extra))
    out = tmp_path / "out"
    proc = research(tmp_path, str(study), "--dir", str(out))
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    before = {rid: r["attempts"] for rid, r in state(out)["runs"].items() if r["status"] == "done"}
    assert sorted(before) == ["lr-1e-4-s1", "lr-1e-4-s2", "lr-3e-4-s1", "lr-3e-4-s2", "lr-3e-5-s1"]

    proc = research(tmp_path, "--resume", str(out), "--more-seeds", "1")
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    assert "seeds [3] added; the study has 3 seeds" in log
    final = state(out)
    assert final["study"]["seeds"] == [1, 2, 3]
    assert final["study"]["budget"]["total_minutes"] == pytest.approx(6)
    assert {rid: r["status"] for rid, r in final["runs"].items() if rid.endswith("-s3")} == {
        "lr-1e-4-s3": "done", "lr-3e-4-s3": "done", "lr-3e-5-s3": "halved",
    }  # fmt: skip
    assert all(final["runs"][rid]["attempts"] == attempts for rid, attempts in before.items())
    assert final["runs"]["lr-3e-4-s3"]["metric"] == pytest.approx(0.63)  # 0.3 + 1000 * lr + 0.01 * seed
    assert sorted(fake_log(tmp_path)).count("lr-1e-4-s3") == 1 and len(fake_log(tmp_path)) == 7
    assert "| lr-3e-4 | 3 | 0.620 |" in (out / "report.md").read_text()

    proc = research(tmp_path, str(study), "--more-seeds", "1")
    log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--more-seeds N goes with --resume DIR" in log
