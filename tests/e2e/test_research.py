"""`swarmrl research` end to end with real `swarmrl up` runs (slow: minutes).

A tiny study (2 arms x 1 seed, runs of a few trainer steps) runs both arms at once on one shared
nats-server, each in NATS accounts of its own; `swarmrl research` is SIGKILLed while both run and
resumed. Checked: the interrupted runs restart and finish, each run's ledger holds only its own
episodes (no collision on the shared server), every run has its metric, and the report is written.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmrl.infra.nats_server import NatsServer
from swarmrl.research.accounts import RunAccounts
from swarmrl.services.ledger.query import connect

STUDY = """
name = "e2e"
question = "Does the learning rate change a tiny guess_number run?"
seeds = [1]
[baseline.flags]                 # guess_number: a random-init model wins some games by luck
model = "{model}"
task = "guess_number"
clients = 1
concurrency = 2
num-repeat = 4
batch-groups = 1
max-tokens = 6
eval-limit = 2
eval-samples = 1
eval-every = 2
[arms.fast]
flags = {{ lr = 3e-4 }}
[metric]
use = "best_success"
[budget]
run_minutes = 3
run_steps = 4
"""


def research(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "swarmrl.cli", "research", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait(predicate, timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"swarmrl research exited with {proc.returncode}: {proc.communicate()[0]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def tails(out: Path, n: int = 15) -> str:
    """The last lines of every attempt's `up.out`: what a failing assertion shows."""
    return "\n".join(
        f"--- {p.relative_to(out)}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:])
        for p in sorted(out.glob("runs/*/up.out"))
    )


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_tiny_study_on_a_shared_server_survives_kill_9(
    tmp_path: Path, tiny_model_dir: Path, nats_server: NatsServer
) -> None:
    study, out = tmp_path / "study.toml", tmp_path / "study"
    study.write_text(STUDY.format(model=tiny_model_dir))
    shared = ["--nats", nats_server.plain_url, "--nats-conf", str(nats_server.conf_dir)]
    proc = research(str(study), "--dir", str(out), "--parallel", "2", *shared)
    outs = [out / "runs" / rid / "up.out" for rid in ("baseline-s1", "fast-s1")]
    wait(lambda: all(p.exists() and "] step" in p.read_text() for p in outs), 600, "both runs training", proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    pids = [r["attempts"][-1]["pid"] for r in json.loads((out / "state.json").read_text())["runs"].values()]
    wait(lambda: not any(alive(p) for p in pids), 300, "the runs' up to stop after research died")

    first = json.loads((out / "state.json").read_text())["runs"]
    assert {rid: (r["status"], len(r["attempts"])) for rid, r in first.items()} == {
        "baseline-s1": ("running", 1),
        "fast-s1": ("running", 1),
    }, f"a run had ended before research was killed:\n{json.dumps(first, indent=1)}\n{tails(out)}"

    proc = research("--resume", str(out))
    log, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, log
    assert log.count("was interrupted (attempt 1") == 2 and "restarts from the beginning" in log, log
    runs = json.loads((out / "state.json").read_text())["runs"]
    assert {rid: (r["status"], len(r["attempts"])) for rid, r in runs.items()} == {
        "baseline-s1": ("done", 2),
        "fast-s1": ("done", 2),
    }
    assert all(r["metric"] is not None for r in runs.values())
    episodes = {}
    for rid in runs:
        con = connect(out / "runs" / rid)
        episodes[rid] = {e for (e,) in con.execute("SELECT episode_id FROM episodes").fetchall()}
        # both swarms played (on 2 busy cores a run may take no trainer step in its budget)
        assert con.execute("SELECT count(*) FROM episodes WHERE status = 'ok'").fetchone()[0] > 0
    assert all(episodes.values()) and not (episodes["baseline-s1"] & episodes["fast-s1"])  # no collision
    assert RunAccounts(nats_server.conf_dir).keys() == []
    report = (out / "report.md").read_text()
    assert "| fast | 1 |" in report and "swarmrl up --model" in report
