"""Self-healing in `swarmrl up`: the restart policy (pure), the supervisor's decisions on stand-in
processes with a clock given by the test, and one real child that keeps dying."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, cast

from swarmrl.report import restart_counts
from swarmrl.supervisor import RESTARTS_FILE, RestartPolicy, Supervisor

POLICY = RestartPolicy(backoff_s=1.0, max_backoff_s=30.0, max_exits=5, window_s=120.0)


def test_backoff_doubles_per_recent_exit_and_the_fifth_exit_in_the_window_gives_up() -> None:
    exits: list[float] = []
    delays = []
    for now in (0.0, 2.0, 5.0, 10.0):
        exits.append(now)
        delays.append(POLICY.delay(exits, now))
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert POLICY.delay([*exits, 20.0], 20.0) is None


def test_exits_older_than_the_window_are_forgotten() -> None:
    assert POLICY.delay([0.0, 40.0, 50.0, 60.0, 150.0], 150.0) == 8.0  # the exit at 0 s no longer counts
    assert POLICY.delay([0.0, 10.0, 20.0, 30.0, 400.0], 400.0) == 1.0  # up for a whole window: start afresh
    assert POLICY.recent([0.0, 100.0, 130.0], 130.0) == [100.0, 130.0]


def test_backoff_is_capped() -> None:
    policy = RestartPolicy(backoff_s=1.0, max_backoff_s=30.0, max_exits=100, window_s=1000.0)
    assert policy.delay([float(t) for t in range(10)], 9.0) == 30.0


class FakeProc:
    """Stands in for a Popen: `returncode` is None while it "runs"."""

    pids = iter(range(1000, 2000))

    def __init__(self) -> None:
        self.pid = next(self.pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


def _sup(tmp_path: Path, names: list[str]) -> tuple[Supervisor, dict[str, list[FakeProc]]]:
    """A supervisor of fake children; `started[name]` lists every process started under `name`."""
    sup = Supervisor(tmp_path / "logs", policy=POLICY)
    started: dict[str, list[FakeProc]] = {}
    for name in names:

        def start(name: str = name) -> subprocess.Popen[bytes]:
            started[name].append(FakeProc())
            return cast(Any, started[name][-1])

        started[name] = []
        sup.adopt(name, start(), start)
    return sup, started


def test_a_dead_child_is_restarted_after_its_backoff_under_the_same_name(tmp_path: Path) -> None:
    sup, started = _sup(tmp_path, ["merger", "ledger"])
    started["merger"][0].returncode = -9
    assert sup.heal(now=100.0) is None
    assert sup.next_due() == 101.0 and len(started["merger"]) == 1, "restarted before its backoff"
    assert sup.heal(now=100.5) is None and len(started["merger"]) == 1
    assert sup.heal(now=101.0) is None
    assert len(started["merger"]) == 2 and sup.procs["merger"] is cast(Any, started["merger"][1])
    assert sup.restarts == {"merger": 1} and sup.next_due() is None and sup.dead() == {}
    assert len(started["ledger"]) == 1, "a running child is left alone"
    journal = [json.loads(line) for line in (tmp_path / "logs" / RESTARTS_FILE).read_text().splitlines()]
    assert [(r["event"], r["name"]) for r in journal] == [("exit", "merger"), ("restart", "merger")]
    assert (
        journal[0]["how"] == "exit code -9" and journal[0]["attempt"] == 1 and journal[0]["backoff_s"] == 1.0
    )
    assert restart_counts(tmp_path) == {"merger": 1}


def test_a_finished_trainer_stays_dead_and_a_retired_client_is_not_restarted(tmp_path: Path) -> None:
    sup, started = _sup(tmp_path, ["trainer", "client-calc-0"])
    started["trainer"][0].returncode = 0
    started["client-calc-0"][0].returncode = 1
    assert sup.heal(lambda name, rc: name == "trainer" and rc == 0, now=0.0) is None
    assert sup.dead() == {"trainer": 0, "client-calc-0": 1} and list(sup._due) == ["client-calc-0"]
    sup.retire(["client-calc-0"])  # `swarmrl clients restart` took it over before its backoff ended
    assert sup.heal(lambda name, rc: name == "trainer" and rc == 0, now=10.0) is None
    assert len(started["client-calc-0"]) == 1 and len(started["trainer"]) == 1 and not sup.restarts


def test_a_crash_loop_stops_with_the_name_the_exit_and_the_log_tail(tmp_path: Path) -> None:
    sup, started = _sup(tmp_path, ["gateway"])
    sup.log_dir.mkdir(parents=True)
    sup.log_path("gateway").write_text("".join(f"line {i}\n" for i in range(100)) + "ValueError: bad flag\n")
    now = 0.0
    for _ in range(4):
        started["gateway"][-1].returncode = 2
        assert sup.heal(now=now) is None
        now = cast(float, sup.next_due())
        assert sup.heal(now=now) is None
    started["gateway"][-1].returncode = 2
    reason = sup.heal(now=now)
    assert reason is not None and reason.startswith("gateway exited unexpectedly 5 times in 120s")
    assert "exit code 2" in reason and "ValueError: bad flag\n" in reason
    assert reason.endswith("--- swarmrl up: restarting gateway (restart 4) ---"), (
        "restarts are marked in the log"
    )
    assert "line 85" in reason and "line 84\n" not in reason, "the last 20 lines, not more"
    assert sup.restarts == {"gateway": 4} and now == 1 + 2 + 4 + 8


def test_a_failed_restart_counts_as_one_more_exit(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs", policy=POLICY)
    proc = FakeProc()
    proc.returncode = -9

    def start() -> subprocess.Popen[bytes]:
        raise RuntimeError("nats-server exited with 1: address in use")

    sup.adopt("nats", cast(Any, proc), start, log=tmp_path / "nats.log")
    assert sup.heal(now=0.0) is None and sup.heal(now=1.0) is None
    assert sup._due == {"nats": 3.0}, "the failed start waits the second backoff (2 s)"
    assert sup.log_path("nats") == tmp_path / "nats.log"


# -- one real child -------------------------------------------------------------------------------------

DIES = "import sys, time; print('starting up', flush=True); time.sleep(0.2); sys.exit('boom: bad config')"


def test_a_real_child_is_restarted_with_backoff_then_given_up_on(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs", policy=RestartPolicy(backoff_s=0.2, max_exits=3, window_s=60))
    first = sup.spawn("merger", ["-c", DIES])
    pids, reason = [first.pid], None
    deadline = time.monotonic() + 30
    while reason is None and time.monotonic() < deadline:
        reason = sup.heal()
        if sup.procs["merger"].pid != pids[-1]:
            pids.append(sup.procs["merger"].pid)
        time.sleep(0.02)
    assert reason is not None, "no crash loop detected in 30 s"
    assert len(pids) == 3 and sup.restarts == {"merger": 2}, pids
    assert reason.startswith("merger exited unexpectedly 3 times in 60s (crash loop; last: exit code 1)")
    assert reason.count("boom: bad config") == 3 and "starting up" in reason, reason
    journal = [json.loads(line) for line in (tmp_path / "logs" / RESTARTS_FILE).read_text().splitlines()]
    exits = [r for r in journal if r["event"] == "exit"]
    restarts = [r for r in journal if r["event"] == "restart"]
    assert [r["backoff_s"] for r in exits] == [0.2, 0.4, None]
    # each restart waited out its backoff after the exit before it
    for exit_, restart, backoff in zip(exits, restarts, (0.2, 0.4), strict=False):
        assert restart["ts"] - exit_["ts"] >= backoff - 0.01
    sup.stop(timeout=1)


def test_children_are_found_by_role_whatever_their_names(tmp_path: Path) -> None:
    """`up` stops its processes in order by role (clients, services, ledger and tracker last); a
    restarted child keeps its role, and a name says nothing about it."""
    sup = Supervisor(tmp_path / "logs", policy=POLICY)
    for name, role in (("nats", "nats"), ("ledger-0", "ledger"), ("engine-policy", "engine"),
                       ("ledger-watch", "client"), ("client-calculator-0", "client")):  # fmt: skip
        start = cast(Any, FakeProc)
        sup.adopt(name, start(), start, role=role)
    assert sup.having({"client"}) == ["ledger-watch", "client-calculator-0"]
    assert sup.having({"ledger", "tracker"}) == ["ledger-0"]
    sup.procs["ledger-0"].returncode = 1  # type: ignore[attr-defined]
    assert sup.heal(now=0.0) is None and sup.heal(now=5.0) is None  # restarted after its backoff
    assert sup.restarts["ledger-0"] == 1 and sup.having({"ledger"}) == ["ledger-0"]
