"""Chaos, short: `bench/chaos.py` for a few minutes. The swarm trains on a local 3-node JetStream
cluster while clients, each service and one node are SIGKILLed (`up` restarts them; the node comes
back on its store); then the streams and the ledger are accounted exactly, against a fault-free run
of the same swarm that the benchmark runs first.

What a few minutes on the random-init model cannot show is left to `just chaos`: held-out success
there is luck (guess_number, 2 eval instances), so the learning checks are reported, not asserted,
and `ok` (every check at once) is asserted to be exactly their conjunction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_up import _assert_no_orphans

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_loses_and_doubles_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    faults = ["--service-kills", "1", "--node-kills", "1", "--node-down-s", "8", "--min-gap-s", "8",
              "--episode-timeout-s", "30", "--warmup-s", "3", "--client-every-s", "3", "--concurrency", "2"]  # fmt: skip
    # guess_number on the random-init tiny model: most games are lost, so most groups have zero
    # advantage. They are trained here (--no-skip-zero-adv-groups: a step whose loss is 0), so a
    # restarted trainer's recovery (its next step) does not wait for a group won by luck, which
    # sometimes came too late for the budget. Without admission control (--max-backlog 0).
    up = ["--model", str(tiny_model_dir), "--task", "guess_number", "--clients", "2", "--num-repeat", "4",
          "--batch-groups", "1", "--max-tokens", "6", "--eval-limit", "2", "--eval-samples", "1", "--eval-every", "100",
          "--max-backlog", "0", "--trainer-arg=--no-skip-zero-adv-groups"]  # fmt: skip
    cmd = [sys.executable, "bench/chaos.py", "--minutes", "3.5", *faults, "--work-dir", str(tmp_path / "work"),
           "--out", str(tmp_path), "--name", "chaos", "--", *up]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=840)
    out = proc.stdout.decode(errors="replace")
    assert (tmp_path / "chaos.json").exists(), out[-3000:]
    r = json.loads((tmp_path / "chaos.json").read_text())
    _assert_no_orphans(tmp_path / "work" / "run")
    assert r["up_returncode"] == 0, out[-3000:]
    for kind in ("client", "merger", "trainer", "ledger", "gateway", "engine", "nats-node"):
        assert r["faults_per_kind"].get(kind, 0) >= 1, (kind, r["faults_per_kind"], out[-2000:])
    acct = r["accounting"]
    assert r["lost"] == 0, (acct["lost_summary"], acct["lost"][:5])
    assert r["doubled"] == 0, acct["doubled"]
    assert acct["ended_samples_exactly_once"] > 0
    assert r["checks"]["aborted / never-ended episodes without samples"], acct
    assert r["checks"]["every dropped episode's models told (lost-episode records)"], acct[
        "lost_records_missing"
    ]
    assert r["checks"]["ledger rows = stream messages"], acct["ledger"]
    assert r["checks"]["no dead letters"], acct["dead_letter_list"]
    assert r["checks"]["every fault recovered"], r["recovery"]
    assert acct["episodes"]["touched_by_client_kills"] > 0
    # Restarted clients continue their task streams: no round is begun by two lifetimes of a client.
    assert r["checks"]["restarted clients continued their task streams (no round begun twice)"], acct[
        "episodes"
    ]
    assert r["restarts"] and sum(v for k, v in r["restarts"].items() if k.startswith("client-")) >= 1
    assert r["baseline"] is not None and (tmp_path / "chaos-fault-free.json").exists()
    assert r["checks"]["distinct instances per training episode >= 0.9x the fault-free run's"] is not None
    assert r["ok"] == all(v is True for v in r["checks"].values())
    assert r["restarts"].get("merger", 0) >= 1 and r["restarts"].get("trainer", 0) >= 1, r["restarts"]
    assert proc.returncode == (0 if r["ok"] else 1), out[-3000:]
