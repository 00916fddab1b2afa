"""`swarmrl clients`: replace a task's client processes in a running `swarmrl up` (live code iteration).

    swarmrl clients restart calculator              # edit agents/tasks/calculator.py, then this
    swarmrl clients restart calculator --version v2 --run-dir runs/exp1
    swarmrl clients list

Talks to the run's control socket (`<run_dir>/control.sock`, see `swarmrl/control.py`). A restart
drains the task's clients (groups in flight finish or are aborted, none is lost or counted twice),
then starts the new code; the reply comes when the new clients run. Other tasks and the services
keep going. Every event of the new clients carries the new `client_version` (default: a hash of the
built-in client code, or `--version`), so the report and `swarmrl query` tell the versions apart.

Stdlib only: it must start fast.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any

SOCKET_NAME = "control.sock"  # = swarmrl.control.SOCKET_NAME (not imported: it pulls in the supervisor)
DEFAULT_TIMEOUT_S = 180.0
"""A restart waits for the old clients to drain (30 s) and exit (15 s more at worst)."""


class ClientsError(RuntimeError):
    """No answer from a running swarm; the message says what was looked for."""


def find_run_dir(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    try:
        from swarmrl.rundir import latest_run_dir
    except ImportError:
        latest: Path | None = Path("runs/latest") if Path("runs/latest").is_dir() else None
    else:
        latest = latest_run_dir()
    if latest is None:
        raise ClientsError("no running swarm: no latest run found (start `swarmrl up`, or pass --run-dir)")
    return latest


def request(run_dir: Path, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request to the `swarmrl up` of `run_dir` and return its reply."""
    path = run_dir / SOCKET_NAME
    if not path.exists():
        raise ClientsError(
            f"no running swarm in {run_dir}: no control socket {path} (is `swarmrl up` running?)"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            raise ClientsError(f"no running swarm in {run_dir}: {path} does not answer ({exc})") from None
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        try:
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            raise ClientsError(
                f"no reply from {path} in {timeout:g}s (the restart may still finish; see {run_dir / 'logs'})"
            ) from None
    if not buf:
        raise ClientsError(f"{path} closed the connection without a reply (is `swarmrl up` stopping?)")
    reply: dict[str, Any] = json.loads(buf)
    return reply


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
        sp.add_argument(
            "--run-dir", type=Path, default=None, help="the run directory (default: the latest run)"
        )
        sp.add_argument(
            "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the reply"
        )
    args = p.parse_args(argv)
    req: dict[str, Any] = {"verb": args.cmd}
    if args.cmd == "restart":
        req["task"] = args.task
        if args.version:
            req["version"] = args.version
    try:
        run_dir = find_run_dir(args.run_dir)
        reply = request(run_dir, req, args.timeout)
    except ClientsError as exc:
        print(f"swarmrl clients: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"swarmrl clients: {reply.get('error', reply)}", file=sys.stderr)
        return 1
    if args.cmd == "list":
        for task, info in reply["tasks"].items():
            print(f"{task}: generation {info['generation']}, version {info['version'] or '(default)'}: "
                  f"{', '.join(info['clients']) or '(no clients)'}")  # fmt: skip
        return 0
    killed = f"; killed after the drain timeout: {', '.join(reply['killed'])}" if reply.get("killed") else ""
    print(
        f"swarmrl clients: replaced {reply['task']} clients {', '.join(reply['old'])} "
        f"(drained in {reply['drained_s']:.1f}s{killed}) with {', '.join(reply['new'])} "
        f"(generation {reply['generation']}, version {reply['version'] or '(default)'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
