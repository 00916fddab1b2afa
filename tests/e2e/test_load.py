"""Load test, short: `bench/load.py --quick` with one and with two replicas of each service.

A tiny ramp (8 then 32 agents in two load processes, 12 s a stage) on the random-init tiny model:
the figures are not asserted (they measure the machine), only that load flowed and that nothing of it
was lost or doubled on the way to the ledger, which is what would make the figures wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # not a zombie
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_load_quick_counts_every_ended_episode_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    # --p99-bound-s: no latency bound, so a busy machine cannot end the ramp after its first stage
    cmd = [sys.executable, "bench/load.py", "--quick", "--replicas", "1,2", "--stage-s", "12",
           "--p99-bound-s", "1e9", "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=840)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    r = json.loads((tmp_path / "load.json").read_text())
    assert "on paper" in (tmp_path / "load.md").read_text()
    assert [run["replicas"] for run in r["runs"]] == [1, 2]
    for run in r["runs"]:
        stages, final, ledger = run["stages"], run["agents_final"], run["ledger"]
        assert [s["agents"] for s in stages] == [8, 32], (run["stop_reason"], out[-2000:])
        assert all(s["episodes_per_s"] > 0 and s["calls_per_s"] > 0 for s in stages), stages
        assert all(s["errors"] == 0 for s in stages), [s["error_examples"] for s in stages]
        assert any(k.startswith("merger/") for k in stages[-1]["events_per_s"]), stages[-1]["events_per_s"]
        assert any(k.startswith("ledger/") for k in stages[-1]["events_per_s"]), stages[-1]["events_per_s"]
        assert final["processes_reported"] == 2 and final["ended"] > 0 and final["errors"] == 0, final
        assert run["pipeline_settled"], run
        # Every episode an agent ended is in the ledger once, as ended; every call it made, once.
        assert ledger["episodes_by_status"].get("ok", 0) == final["ended"], (ledger, final)
        assert ledger["episodes_by_status"].get("open", 0) == 0, ledger
        assert ledger["llm_calls"] == final["calls"], (ledger, final)
        assert not [n for n, pid in run["pids"].items() if n != "bench" and _alive(pid)], run["pids"]
    two = r["runs"][1]["stages"][-1]["events_per_s"]
    assert sum(k.startswith("merger/") for k in two) == 2, two  # each replica's own figure
