"""Child processes of `swarmrl up`, each logging to the run dir and restarted when it exits.

Children get their own session (Ctrl-C reaches only `up`, which stops them in order) and a
parent-death signal, so even a SIGKILLed `up` leaves no orphans. `heal()` starts an exited child
again after a backoff (`RestartPolicy`); every service resumes from its durable state, so a restart
loses nothing. A crash loop is given up on: `heal()` returns why, with the child's last log lines.
Exits and restarts are appended to `<log_dir>/restarts.jsonl` (the run report counts them).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("swarmrl.up")
PR_SET_PDEATHSIG = 1
RESTARTS_FILE = "restarts.jsonl"  # in the log dir: exits and restarts, one JSON object a line
TAIL_LINES = 20

Start = Callable[[], "subprocess.Popen[bytes]"]
SERVER_PASSWORD = re.compile(r"^SWARM_[A-Z_]+_PASSWORD$")
"""The variables nats-server reads its users' passwords from (`infra/credentials.py`, `password_var`)."""


def die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: Ctrl-C handling in `up` still stops the children
        pass


@dataclass(frozen=True)
class RestartPolicy:
    """When to start an exited child again: the k-th exit within `window_s` after
    `backoff_s * 2**(k-1)` seconds (at most `max_backoff_s`); the `max_exits`-th is a crash loop."""

    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_exits: int = 5
    window_s: float = 120.0

    def recent(self, exits: list[float], now: float) -> list[float]:
        return [t for t in exits if now - t < self.window_s]

    def delay(self, exits: list[float], now: float) -> float | None:
        """Seconds before restarting after the newest of `exits`, or None: a crash loop, give up."""
        n = len(self.recent(exits, now))
        if n >= self.max_exits:
            return None
        return min(self.max_backoff_s, self.backoff_s * 2 ** max(n - 1, 0))


def log_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a log file ("" if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


@dataclass
class Supervisor:
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    retired: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    """Processes taken out of `procs` on purpose (replaced clients): their exit is expected."""
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    starts: dict[str, Start] = field(default_factory=dict)  # how to start each child again
    restarts: Counter[str] = field(default_factory=Counter)
    logs: dict[str, Path] = field(default_factory=dict)  # adopted children's, if not the default
    roles: dict[str, str] = field(default_factory=dict)
    """Each child's role (its service, `client`, `nats`): what `up` stops it in order by."""
    pids_file: Path | None = None  # kept up to date with each child's pid (`up`'s `pids.json`)
    _exits: dict[str, list[float]] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)  # name -> monotonic time of its restart

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        python: bool = True,
        role: str = "",
    ) -> subprocess.Popen[bytes]:
        """Start `argv` (this Python's arguments, or a whole command if not `python`) as child `name`."""
        cmd = [sys.executable, *argv] if python else list(argv)
        # The servers' password variables stay here: a child gets the one URL its role needs (`env`).
        inherited = {k: v for k, v in os.environ.items() if not SERVER_PASSWORD.match(k)}
        full_env = inherited | (env or {})
        log_file = self.log_path(name)

        def start() -> subprocess.Popen[bytes]:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(log_file, "ab") as out:  # the child keeps its own copy of the descriptor
                return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                        start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip

        proc = self.adopt(name, start(), start, role=role)
        log.info("started %s pid=%d", name, proc.pid)
        return proc

    def adopt(
        self, name: str, proc: subprocess.Popen[bytes], start: Start, log: Path | None = None, role: str = ""
    ) -> subprocess.Popen[bytes]:
        """Supervise `proc` under `name` in `role`; `start()` starts it again (raising OSError or
        RuntimeError when it cannot). `log`: its log file, for a process started elsewhere."""
        self.procs[name] = proc
        self.starts[name] = start
        self.roles[name] = role
        if log is not None:
            self.logs[name] = log
        self._due.pop(name, None)
        self._write_pids()
        return proc

    def log_path(self, name: str) -> Path:
        return self.logs.get(name, self.log_dir / f"{name}.log")

    def retire(self, names: list[str]) -> dict[str, subprocess.Popen[bytes]]:
        """Move `names` from `procs` to `retired`: their exit is expected, the caller stops them."""
        out = {n: self.procs.pop(n) for n in names if n in self.procs}
        for n in out:
            self._due.pop(n, None)
        self.retired.update(out)
        return out

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def having(self, roles: set[str] | frozenset[str]) -> list[str]:
        """The children whose role is one of `roles`, in start order."""
        return [n for n in self.procs if self.roles.get(n) in roles]

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    def _write_pids(self) -> None:
        if self.pids_file is not None:
            self.pids_file.write_text(json.dumps(self.pids()))

    def next_due(self) -> float | None:
        return min(self._due.values(), default=None)

    def heal(
        self, finished: Callable[[str, int], bool] = lambda name, rc: False, now: float | None = None
    ) -> str | None:
        """Schedule a restart of every child that exited (unless `finished(name, exit code)`) and
        start those whose backoff is over. Returns None, or why the run must stop: a crash loop."""
        now = time.monotonic() if now is None else now
        for name, rc in self.dead().items():
            if name not in self._due and not finished(name, rc):
                if reason := self._exited(name, f"exit code {rc}", now):
                    return reason
        for name, due in sorted(self._due.items(), key=lambda kv: kv[1]):
            if due > now:
                continue
            del self._due[name]
            note = f"--- swarmrl up: restarting {name} (restart {self.restarts[name] + 1}) ---"
            _append(self.log_path(name), note)  # in its own log: its tail shows which run a line is of
            try:
                proc = self.starts[name]()
            except (OSError, RuntimeError) as exc:  # cannot start: counts as one more exit
                if reason := self._exited(name, f"restart failed: {exc}", now):
                    return reason
                continue
            self.procs[name] = proc
            self._write_pids()
            self.restarts[name] += 1
            log.warning("restarted %s pid=%d (restart %d)", name, proc.pid, self.restarts[name])
            self._journal(
                {"event": "restart", "name": name, "pid": proc.pid, "restarts": self.restarts[name]}
            )
        return None

    def _exited(self, name: str, how: str, now: float) -> str | None:
        exits = self._exits[name] = self.policy.recent([*self._exits.get(name, []), now], now)
        delay = self.policy.delay(exits, now)
        self._journal({"event": "exit", "name": name, "how": how, "attempt": len(exits), "backoff_s": delay})
        if delay is None:
            path = self.log_path(name)
            log.error(
                "%s exited (%s) %d times in %gs: giving up", name, how, len(exits), self.policy.window_s
            )
            return (
                f"{name} exited unexpectedly {len(exits)} times in {self.policy.window_s:g}s (crash loop; "
                f"last: {how}); last lines of {path}:\n{log_tail(path)}"
            )
        log.warning("%s exited (%s); restart attempt %d in %gs", name, how, len(exits), delay)
        self._due[name] = now + delay
        return None

    def _journal(self, record: dict[str, object]) -> None:
        _append(self.log_dir / RESTARTS_FILE, json.dumps({"ts": time.time(), **record}))

    def stop(self, names: list[str] | None = None, timeout: float = 15.0) -> None:
        """Stop `names` (default: every child), newest first (`terminate`)."""
        targets = [n for n in reversed(list(self.procs)) if names is None or n in names]
        for n in targets:
            self._due.pop(n, None)
        terminate({n: self.procs[n] for n in targets}, timeout)


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def terminate(procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> list[str]:
    """SIGTERM `procs`, wait up to `timeout`, then SIGKILL what is left with its session (an
    `accelerate launch` trainer's processes, an engine's workers); returns the names killed."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline, killed = time.monotonic() + timeout, []
    for n, proc in procs.items():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0fs; killing it", n, timeout)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
            killed.append(n)
    return killed
