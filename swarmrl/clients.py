"""The client side of a running swarm's control plane (`swarm.ctl.*`, see `swarmrl/control.py`):

    swarmrl clients restart calculator              # edit agents/tasks/calculator.py, then this
    swarmrl clients restart calculator --version v2 --run-dir runs/exp1
    swarmrl clients list
    swarmrl status                                  # processes, restarts, steps, eval, clients
    swarmrl down

The swarm's service URL comes from `$SWARMRL_NATS` (from any machine that reaches its NATS), else
from the run's owner-only `service.json` (the latest run, or `--run-dir`). A restart drains the
task's clients (no group lost or counted twice), then starts the new code, whose events carry the
new `client_version` (default: a hash of the built-in client code, or `--version`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from swarmrl.core import rundir
from swarmrl.core.config import plain_servers
from swarmrl.core.rundir import SERVICE_FILE, latest_run_dir

DEFAULT_TIMEOUT_S = 180.0
"""Enough for a restart: the old clients drain (30 s) and exit (15 s more at worst)."""


class ClientsError(RuntimeError):
    """No answer from a running swarm; the message says what was looked for."""


def _error(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def service_url(run_dir: Path | None) -> str:
    """The swarm's service URL: `$SWARMRL_NATS`, else the run's `service.json`."""
    if url := os.environ.get("SWARMRL_NATS"):
        return url
    run = run_dir or latest_run_dir()
    if run is None:
        raise ClientsError("no running swarm: set $SWARMRL_NATS (its service URL) or pass --run-dir")
    path = run / SERVICE_FILE
    try:
        return str(json.loads(path.read_text())["nats"])
    except FileNotFoundError:
        raise ClientsError(
            f"no running swarm in {run}: no {path} (is `swarmrl up` running? from another machine, "
            "set $SWARMRL_NATS to the swarm's service URL)"
        ) from None
    except (OSError, ValueError, KeyError) as exc:
        raise ClientsError(f"unreadable {path}: {exc!r}") from None


def request(verb: str, body: dict[str, Any], run_dir: Path | None, timeout: float) -> dict[str, Any]:
    """One control request (`swarm.ctl.<verb>`) and its reply."""
    url = service_url(run_dir)
    shown = ",".join(plain_servers(url))  # for messages: no password

    async def ask() -> dict[str, Any]:
        import nats
        from nats.errors import NoRespondersError, NoServersError
        from nats.errors import TimeoutError as NatsTimeout

        from swarmrl.schemas.subjects import control_subject

        try:
            nc = await nats.connect(
                servers=[u.strip() for u in url.split(",")], connect_timeout=5, max_reconnect_attempts=0,
                allow_reconnect=False,
            )  # fmt: skip
        except (NoServersError, OSError, TimeoutError) as exc:
            raise ClientsError(f"no running swarm at {shown}: {exc!r}") from None
        try:
            msg = await nc.request(control_subject(verb), json.dumps(body).encode(), timeout=timeout)
        except NoRespondersError:
            raise ClientsError(f"no swarm answers on {control_subject(verb)} at {shown}") from None
        except (NatsTimeout, TimeoutError):
            raise ClientsError(
                f"no reply in {timeout:g}s (a restart may still finish; see the run's logs)"
            ) from None
        finally:
            await nc.close()
        return dict(json.loads(msg.data))

    return asyncio.run(ask())


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-dir", type=Path, default=None,
        help="the run directory whose service.json to use (default: the latest run; $SWARMRL_NATS wins)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the reply")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="swarmrl clients", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    restart = sub.add_parser("restart", help="drain a task's clients and start them again with the new code")
    restart.add_argument("task", help="the task whose clients to replace")
    restart.add_argument("--version", default="",
                         help="client_version of the new clients (default: a hash of the built-in client code; "
                         "for a task with its own command, the SDK's default)")  # fmt: skip
    lst = sub.add_parser("list", help="each task's client processes, generation and version")
    for sp in (restart, lst):
        _common(sp)
    args = p.parse_args(argv)
    body: dict[str, Any] = {}
    if args.cmd == "restart":
        body["task"] = args.task
        if args.version:
            body["version"] = args.version
    try:
        reply = request(args.cmd, body, args.run_dir, args.timeout)
    except ClientsError as exc:
        return _error(f"swarmrl clients: {exc}")
    if not reply.get("ok"):
        return _error(f"swarmrl clients: {reply.get('error', reply)}")
    if args.cmd == "list":
        print(_tasks(reply["tasks"]))
        return 0
    killed = f"; killed after the drain timeout: {', '.join(reply['killed'])}" if reply.get("killed") else ""
    print(
        f"swarmrl clients: replaced {reply['task']} clients {', '.join(reply['old'])} "
        f"(drained in {reply['drained_s']:.1f}s{killed}) with {', '.join(reply['new'])} "
        f"(generation {reply['generation']}, version {reply['version'] or '(default)'})"
    )
    return 0


def _tasks(tasks: dict[str, Any]) -> str:
    return "\n".join(
        f"{task}: generation {info['generation']}, version {info['version'] or '(default)'}: "
        f"{', '.join(info['clients']) or '(no clients)'}"
        for task, info in tasks.items()
    )


def status(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="swarmrl status",
        description="Show a running swarm: its processes and restarts, each model's step, the latest "
        "eval, and each task's clients. Needs $SWARMRL_NATS or the run's service.json (see `swarmrl clients`).",
    )
    _common(p)
    p.add_argument("--json", action="store_true", help="print the reply as JSON")
    args = p.parse_args(argv)
    try:
        reply = request("status", {}, args.run_dir, args.timeout)
    except ClientsError as exc:
        return _error(f"swarmrl status: {exc}")
    if args.json or not reply.get("ok"):
        print(json.dumps(reply, indent=1))
        return 0 if reply.get("ok") else 1
    print(f"run {reply['run_dir']}, up {reply['uptime_s']:.0f}s")
    print("progress: " + " | ".join(f"{k} {v}" for k, v in reply["progress"].items()))
    print("processes: " + ", ".join(f"{n} ({pid})" for n, pid in reply["processes"].items()))
    print("restarts: " + (", ".join(f"{n} {k}" for n, k in reply["restarts"].items()) or "none"))
    print(_tasks(reply["tasks"]))
    return 0


def down(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="swarmrl down",
        description="Stop a running `swarmrl up`: through its control plane (swarm.ctl.down; with "
        "$SWARMRL_NATS from any machine, else with the run's service.json), or else by SIGTERM to its pid; it "
        "then stops every service and writes the run's report. Without --run-dir it stops the latest run: "
        f"./{rundir.LATEST_LINK} if present, else the run recorded in $SWARMRL_HOME/{rundir.LATEST_POINTER} "
        f"(now {rundir.latest_pointer()}).",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="the run directory of the swarm to stop")
    args = p.parse_args(argv)
    if os.environ.get("SWARMRL_NATS") or any(
        (run / SERVICE_FILE).exists() for run in (args.run_dir, latest_run_dir()) if run is not None
    ):
        try:
            reply = request("down", {}, args.run_dir, timeout=30)
        except ClientsError as exc:  # not reachable: the pid file, on this machine
            print(f"swarmrl down: {exc}; trying the run's pid file", file=sys.stderr)
        else:
            if reply.get("ok"):
                print("swarmrl down: asked the swarm to stop (swarm.ctl.down)")
                return 0
            return _error(f"swarmrl down: {reply.get('error', reply)}")
    candidates = rundir.pid_candidates(args.run_dir)
    for path in candidates:
        try:
            pid, started = rundir.read_pid(path)
        except FileNotFoundError:
            continue
        except (OSError, ValueError, IndexError) as exc:
            return _error(f"swarmrl down: unreadable pid file {path}: {exc}")
        now = rundir.start_time(pid)
        try:
            if started is not None and now is not None and now != started:
                raise ProcessLookupError  # that pid is another process now
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.unlink()
            print(f"swarmrl down: process {pid} is gone; removed the stale pid file {path}", file=sys.stderr)
            continue
        except PermissionError:
            return _error(f"swarmrl down: not allowed to signal process {pid} (from {path})")
        print(f"swarmrl down: asked swarmrl up (pid {pid}, {path}) to stop")
        return 0
    return _error(f"swarmrl down: no running swarm found (looked for {', '.join(map(str, candidates))})")


if __name__ == "__main__":
    sys.exit(main())
