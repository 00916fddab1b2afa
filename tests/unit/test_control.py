"""The control channel of `swarmrl up` (swarmrl/control.py) and its CLI (swarmrl/clients.py).

Requests go through `handle_request` directly, restarts through a real `Supervisor` with small
stand-in client processes (a few lines of Python that drain on SIGTERM like the runner does).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from swarmrl import clients as clients_cli
from swarmrl.control import (
    ControlServer,
    Restarter,
    TaskClients,
    builtin_client_version,
    client_code_files,
    handle_request,
)
from swarmrl.supervisor import Supervisor

# Exits 0.2 s after SIGTERM (a short drain); with IGNORE it never does and must be killed.
CLIENT = """
import signal, sys, time
mode = sys.argv[1]
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.2), sys.exit(0)))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _restarter(tmp_path: Path, mode: str = "drain", n: int = 2, **kw: object) -> Restarter:
    sup = Supervisor(tmp_path / "logs")
    spawned: list[tuple[str, int, str]] = []
    changes: list[int] = []

    def spawn(task: str, generation: int, version: str) -> list[str]:
        spawned.append((task, generation, version))
        names = [f"client-{task}-{i}" + (f"-g{generation}" if generation else "") for i in range(n)]
        for name in names:
            sup.spawn(name, ["-c", CLIENT, mode])
        return names

    clients = {"calc": TaskClients(spawn("calc", 0, "v0"), 0, "v0"), "guess": TaskClients([], 0, "")}
    r = Restarter(sup, spawn, clients, default_version=lambda task: "hash-now",
                  on_change=lambda: changes.append(1), **kw)  # type: ignore[arg-type]  # fmt: skip
    r.spawned, r.changes = spawned, changes  # type: ignore[attr-defined]
    return r


async def _ready(sup: Supervisor, names: list[str]) -> None:
    """Until each stand-in client has installed its SIGTERM handler (it prints `ready`)."""
    for _ in range(200):
        if all("ready" in (sup.log_dir / f"{n}.log").read_text() for n in names):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"clients {names} never got ready")


async def _req(r: Restarter, req: object) -> dict:
    return await handle_request(json.dumps(req).encode(), r)


async def test_bad_requests_get_clear_errors(tmp_path: Path) -> None:
    r = _restarter(tmp_path, n=0)
    assert (await handle_request(b"{nope\n", r))["error"].startswith("request is not JSON")
    assert "JSON object" in (await _req(r, ["restart"]))["error"]
    assert (await _req(r, {"verb": "reboot"}))["error"] == "unknown verb 'reboot'; verbs: ['list', 'restart']"
    assert "needs a task name" in (await _req(r, {"verb": "restart"}))["error"]
    reply = await _req(r, {"verb": "restart", "task": "x"})
    assert reply == {"ok": False, "error": "unknown task 'x'; tasks: ['calc', 'guess']"}
    assert (
        "version must be a string"
        in (await _req(r, {"verb": "restart", "task": "calc", "version": 2}))["error"]
    )
    assert "no client processes" in (await _req(r, {"verb": "restart", "task": "guess"}))["error"]
    assert r.spawned == [("calc", 0, "v0")]  # type: ignore[attr-defined]


async def test_restart_drains_retires_and_starts_the_next_generation(tmp_path: Path) -> None:
    r = _restarter(tmp_path)
    sup = r.sup
    await _ready(sup, ["client-calc-0", "client-calc-1"])
    old = {n: sup.procs[n] for n in ["client-calc-0", "client-calc-1"]}

    reply = await _req(r, {"verb": "restart", "task": "calc", "version": "v2"})

    assert reply["ok"] and reply["old"] == list(old) and reply["killed"] == []
    assert reply["new"] == ["client-calc-0-g1", "client-calc-1-g1"] and reply["generation"] == 1
    assert reply["version"] == "v2" and reply["drained_s"] >= 0.2
    assert all(p.returncode == 0 for p in old.values()), "old clients did not drain cleanly"
    assert set(sup.procs) == set(reply["new"]) and set(sup.retired) == set(old)
    assert sup.dead() == {}, "a retired client's exit must not count as a crash"
    assert r.changes == [1]  # type: ignore[attr-defined]

    # No version given: the default (the code hash now); generations keep counting.
    await _ready(sup, reply["new"])
    again = await _req(r, {"verb": "restart", "task": "calc"})
    assert again["version"] == "hash-now" and again["new"] == ["client-calc-0-g2", "client-calc-1-g2"]
    status = await _req(r, {"verb": "list"})
    assert status["tasks"]["calc"] == {"clients": again["new"], "generation": 2, "version": "hash-now"}
    await r.close()
    sup.stop()


async def test_a_client_that_ignores_sigterm_is_killed_after_drain_and_grace(tmp_path: Path) -> None:
    r = _restarter(tmp_path, mode="ignore", n=1, drain_s=0.3, grace_s=0.2)
    await _ready(r.sup, ["client-calc-0"])
    reply = await _req(r, {"verb": "restart", "task": "calc"})
    assert reply["killed"] == ["client-calc-0"] and 0.5 <= reply["drained_s"] < 5
    assert r.sup.retired["client-calc-0"].returncode == -9
    r.sup.stop(timeout=0.5)


async def test_socket_is_owner_only_and_serves_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = _restarter(tmp_path, n=1)
    await _ready(r.sup, ["client-calc-0"])
    path = tmp_path / "control.sock"
    server = await ControlServer(path, lambda line: handle_request(line, r)).start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        rc = await asyncio.to_thread(clients_cli.main, ["restart", "nope", "--run-dir", str(tmp_path)])
        assert rc == 1 and "unknown task 'nope'; tasks: ['calc', 'guess']" in capsys.readouterr().err
        argv = ["restart", "calc", "--version", "v2", "--run-dir", str(tmp_path)]
        assert await asyncio.to_thread(clients_cli.main, argv) == 0
        out = capsys.readouterr().out
        assert (
            "replaced calc clients client-calc-0" in out and "client-calc-0-g1" in out and "version v2" in out
        )
        assert await asyncio.to_thread(clients_cli.main, ["list", "--run-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "calc: generation 1, version v2: client-calc-0-g1" in out and "guess: generation 0" in out
    finally:
        await server.close()
    assert not path.exists()
    rc = await asyncio.to_thread(clients_cli.main, ["restart", "calc", "--run-dir", str(tmp_path)])
    assert rc == 1 and "no running swarm" in capsys.readouterr().err
    r.sup.stop(timeout=2)


def test_builtin_client_version_follows_runner_sdk_and_task_code(tmp_path: Path) -> None:
    root = tmp_path / "agents"
    (root / "tasks").mkdir(parents=True)
    for f in ("runner.py", "sdk.py", "tasks/guess.py", "evaluate.py"):
        (root / f).write_text(f"# {f}\n")
    v0 = builtin_client_version(root)
    assert v0.startswith("sha1-") and len(v0) == 17 and builtin_client_version(root) == v0
    (root / "evaluate.py").write_text("# not client code\n")
    assert builtin_client_version(root) == v0
    for f in ("runner.py", "sdk.py", "tasks/guess.py"):
        (root / f).write_text("# edited\n")
        assert builtin_client_version(root) != v0, f
        v0 = builtin_client_version(root)
    (root / "tasks" / "new_task.py").write_text("")
    assert builtin_client_version(root) != v0
    # the real package: the files the runner actually runs
    names = {f.name for f in client_code_files()}
    assert {"runner.py", "sdk.py", "guess_number.py", "base.py"} <= names
