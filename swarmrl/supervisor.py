"""Child processes of `swarmrl up`: each service runs as its own process, logging to the run dir.

Children get their own session (Ctrl-C reaches only `up`, which stops them in order) and a
parent-death signal, so even a SIGKILLed `up` leaves no orphans behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("swarmrl.up")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: Ctrl-C handling in `up` still stops the children
        pass


@dataclass
class Supervisor:
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    retired: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    """Processes taken out of `procs` on purpose (replaced clients): their exit is expected."""

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, python: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start `argv` (arguments of this Python interpreter, or a whole command if not `python`)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            [sys.executable, *argv] if python else argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | (env or {}),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        out.close()
        self.procs[name] = proc
        log.info("started %s pid=%d", name, proc.pid)
        return proc

    def retire(self, names: list[str]) -> dict[str, subprocess.Popen[bytes]]:
        """Move `names` from `procs` to `retired` (unknown names are skipped): from now on their exit
        is not reported by `dead()` and `stop()` leaves them alone; the caller stops them."""
        out = {n: self.procs.pop(n) for n in names if n in self.procs}
        self.retired.update(out)
        return out

    def dead(self) -> dict[str, int]:
        """Children that exited, with their exit codes."""
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self, names: list[str] | None = None, timeout: float = 15.0) -> None:
        """SIGTERM (newest first), wait up to `timeout`, then SIGKILL what is left."""
        targets = [n for n in reversed(list(self.procs)) if names is None or n in names]
        for n in targets:
            if self.procs[n].poll() is None:
                self.procs[n].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for n in targets:
            try:
                self.procs[n].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", n, timeout)
                self.procs[n].kill()
                self.procs[n].wait()
