"""The control plane of `swarmrl up` (swarmrl/control.py) and its CLI (swarmrl/clients.py).

Requests go through `handle_request` directly, restarts through a real `Supervisor` with small
stand-in client processes (a few lines of Python that drain on SIGTERM like the runner does), and
the CLI through a real nats-server (`swarm.ctl.*`, served with `nats.micro`).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from swarmrl import clients as clients_cli
from swarmrl.control import (
    ControlService,
    Plane,
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


async def _req(r: Restarter, req: dict[str, Any]) -> dict:
    return await handle_request(req.pop("verb"), json.dumps(req).encode(), Plane(r))


async def test_bad_requests_get_clear_errors(tmp_path: Path) -> None:
    r = _restarter(tmp_path, n=0)
    assert (await handle_request("list", b"{nope\n", Plane(r)))["error"].startswith("request is not JSON")
    assert "JSON object" in (await handle_request("restart", b'["restart"]', Plane(r)))["error"]
    assert (await _req(r, {"verb": "reboot"}))["error"] == (
        "unknown verb 'reboot'; verbs: ['list', 'restart', 'status', 'down']"
    )
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


async def test_the_cli_drives_the_swarm_over_nats(
    tmp_path: Path, nats_server: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`swarmrl clients restart/list`, `swarmrl status` and `swarmrl down` through `swarm.ctl.*` on a
    real nats-server, with the service URL from the run's owner-only service.json, then from
    $SWARMRL_NATS (as on another machine); agents cannot reach the control plane."""
    from swarmrl.clients import down
    from swarmrl.core.rundir import SERVICE_FILE, write_service_file
    from swarmrl.schemas import subjects as S

    r = _restarter(tmp_path, n=1)
    await _ready(r.sup, ["client-calc-0"])
    stopped: list[int] = []
    plane = Plane(r, status=lambda: {"run_dir": str(tmp_path), "uptime_s": 1.0, "processes": {"merger": 7},
                                     "restarts": {}, "progress": {"step": "3/10"}},
                  down=lambda: stopped.append(1))  # fmt: skip
    service = await ControlService(nats_server.service_url, plane, tmp_path).start()
    monkeypatch.delenv("SWARMRL_NATS", raising=False)
    run = ["--run-dir", str(tmp_path)]
    try:
        rc = await asyncio.to_thread(clients_cli.main, ["restart", "calc", *run])
        assert rc == 1 and "no running swarm" in capsys.readouterr().err  # no service.json yet
        path = write_service_file(tmp_path, nats_server.service_url)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.name == SERVICE_FILE
        rc = await asyncio.to_thread(clients_cli.main, ["restart", "nope", *run])
        assert rc == 1 and "unknown task 'nope'; tasks: ['calc', 'guess']" in capsys.readouterr().err
        assert await asyncio.to_thread(clients_cli.main, ["restart", "calc", "--version", "v2", *run]) == 0
        out = capsys.readouterr().out
        assert (
            "replaced calc clients client-calc-0" in out and "client-calc-0-g1" in out and "version v2" in out
        )
        monkeypatch.setenv("SWARMRL_NATS", nats_server.service_url)  # another machine: no run dir
        assert await asyncio.to_thread(clients_cli.main, ["list"]) == 0
        out = capsys.readouterr().out
        assert "calc: generation 1, version v2: client-calc-0-g1" in out and "guess: generation 0" in out
        assert await asyncio.to_thread(clients_cli.status, []) == 0
        out = capsys.readouterr().out
        assert "progress: step 3/10" in out and "merger (7)" in out and "calc: generation 1" in out
        # An agent identity is in another account: the control subjects do not reach the swarm's.
        import nats

        agent = await nats.connect(**nats_server.agent.nats_options())
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await agent.request(S.control_subject("down"), b"{}", timeout=1.0)
        await agent.close()
        assert stopped == []
        assert await asyncio.to_thread(down, []) == 0 and stopped == [1]
        assert "asked the swarm to stop" in capsys.readouterr().out
    finally:
        await service.close()
    rc = await asyncio.to_thread(clients_cli.main, ["list"])
    assert rc == 1 and "no swarm answers on swarm.ctl.list" in capsys.readouterr().err
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
