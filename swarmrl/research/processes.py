"""The `swarmrl up` processes of a study: starting one, reading how it ended, and clearing leftovers.

Each run is `swarmrl up ... --run-dir DIR --no-display` in a session of its own, its output in
`DIR/up.out`, with a parent-death signal (when research dies, even by `kill -9`, every `up` stops as
after Ctrl-C). `up`'s last line, `swarmrl up: stopped (<reason>). Report: <path>`, says why it ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from swarmrl.core.rundir import pid_file, read_pid
from swarmrl.supervisor import die_with_parent, log_tail

log = logging.getLogger("swarmrl.research")
DEFAULT_UP = [sys.executable, "-m", "swarmrl.cli", "up"]
OUT = "up.out"
FINISHED_REASONS = ("a trainer finished", "time budget")
"""The start of `up`'s reason when a run used its budget (steps or minutes) as planned."""
_STOPPED = "swarmrl up: stopped ("
_PROGRESS = re.compile(r"^\[\d+s\] (.*)$", re.M)


def spawn(argv: list[str], env: dict[str, str], run_dir: Path) -> subprocess.Popen[bytes]:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / OUT, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip


def alive(pid: int | None, started: str | None) -> bool:
    """Whether `pid` runs, not a zombie, and (given `started`) is the process that started then."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return pid is not None and len(fields) > 19 and fields[0] != "Z" and started in (None, fields[19])


def up_reason(run_dir: Path) -> str | None:
    """Why the `up` of `run_dir` stopped (its last line), or None if it never said."""
    try:
        text = (run_dir / OUT).read_text(errors="replace")
    except OSError:
        return None
    i = text.rfind(_STOPPED)
    if i < 0:
        return None
    reason, sep, _ = text[i + len(_STOPPED) :].rpartition("). Report: ")
    return reason if sep else None


def finished(reason: str | None) -> bool:
    return reason is not None and reason.startswith(FINISHED_REASONS)


def progress(run_dir: Path) -> str:
    """The run's last progress line from `up --no-display` (step and eval cells), or ""."""
    if not (run_dir / OUT).is_file():
        return ""
    lines = _PROGRESS.findall(log_tail(run_dir / OUT, 1000, 16_384))
    if not lines:
        return "starting"
    cells = lines[-1].split(" | ")
    step = next((c.rsplit(" ", 1)[1] for c in cells if c.startswith("step ") or " step " in c), "?")
    evals = next((c.removeprefix("eval success ") for c in cells if c.startswith("eval success ")), "-")
    return f"step {step}, eval {evals}"


def stop_leftover(pid: int | None, started: str | None, run_dir: Path, wait_s: float = 180.0) -> None:
    """Wait for the `up` of a run whose research process died to stop (the parent-death SIGTERM is
    on its way), then ask (SIGTERM) and finally force it (SIGKILL to its session)."""
    candidates = [(pid, started)]
    with contextlib.suppress(OSError, ValueError, IndexError):  # the pid `up` recorded in its run dir
        candidates.append(read_pid(pid_file(run_dir)))
    live = [(p, s) for p, s in candidates if p is not None and alive(p, s)]
    if not live:
        return
    log.info("waiting for the leftover swarmrl up of %s (pid %s) to stop", run_dir.name, live[0][0])
    deadline = time.monotonic() + wait_s
    for sig, until in ((None, deadline - 30), (signal.SIGTERM, deadline), (signal.SIGKILL, deadline + 10)):
        for p, s in live:
            if sig is not None and alive(p, s):
                log.warning("sending %s to the leftover swarmrl up (pid %d) of %s", sig.name, p, run_dir.name)
                try:
                    os.killpg(p, sig) if sig == signal.SIGKILL else os.kill(p, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        while time.monotonic() < until and any(alive(p, s) for p, s in live):
            time.sleep(0.5)
        if not any(alive(p, s) for p, s in live):
            return
