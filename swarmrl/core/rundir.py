"""Run directories, the "latest run" pointers, and the pid and service files of a running `up`.

A new run (`make_run_dir`) is recorded as the latest in two places: `$SWARMRL_HOME/latest-run`, a
one-line file naming the last run started on this machine, and `./runs/latest`, a symlink naming the
last one started from this directory (created for runs under `./runs/`; a `runs/latest` that is not
a symlink is never touched). Readers (`latest_run_dir`) prefer the local link. While `up` runs,
`<run>/up.pid` holds its pid and start time (so a reused pid is never signalled) and
`<run>/service.json` (owner-only) its service URL, for `swarmrl clients`, `status` and `down`.

Stdlib only: the CLI imports this for `swarmrl down` and `swarmrl query`, which must start fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger("swarmrl.core.rundir")

RUNS = Path("runs")
LATEST_LINK = RUNS / "latest"
LATEST_POINTER = "latest-run"
PID_NAME = "up.pid"
SERVICE_FILE = "service.json"
"""`{"nats": <service URL>}`, owner-only: the run's service credentials for its control plane."""
LEGACY_PID_FILE = RUNS / ".up.pid"
SWARM_FILE = "swarm.json"
"""The run's resolved swarm description, written at each start (what `up --resume` reads)."""
PARTS_FILE = "parts.jsonl"
"""One line per part of a run (each `up --resume` adds one): when it started and ended, and why."""


def swarmrl_home() -> Path:
    """`$SWARMRL_HOME`, else `~/.cache/swarmrl`: where models are cached and the latest run is recorded."""
    return Path(os.environ.get("SWARMRL_HOME") or Path.home() / ".cache" / "swarmrl")


def latest_pointer() -> Path:
    """The file recording the last run started on this machine: `$SWARMRL_HOME/latest-run`."""
    return swarmrl_home() / LATEST_POINTER


def make_run_dir(arg: Path | None) -> Path:
    """Create the run directory (`--run-dir`, default `runs/<timestamp>`) and record it as the
    latest run; returns it as given (relative paths stay relative)."""
    run_dir = arg or RUNS / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir.resolve()
    with contextlib.suppress(OSError):
        write_private(latest_pointer(), f"{target}\n")
    _update_local_link(target)
    return run_dir


def write_private(path: Path, text: str, mode: int = 0o600, *, fsync: bool = False) -> Path:
    """Write `text` to `path` atomically with `mode` (default owner-only, from its creation): a reader
    never sees a half-written file, and two writers racing leave one whole answer. `fsync`: the file
    and its directory entry are on disk on return, so a crash leaves the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def _update_local_link(target: Path) -> None:
    link = LATEST_LINK
    if not link.is_symlink() and link.exists():
        log.warning("not updating %s: it is not a symlink", link)
        return
    if not link.is_symlink() and not target.is_relative_to(RUNS.resolve()):
        return  # a --run-dir elsewhere: leave this directory alone
    with contextlib.suppress(OSError):
        tmp = link.with_name(f".latest.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)


def latest_run_dir() -> Path | None:
    """The latest run: `./runs/latest` if it exists, else the existing directory named by
    `$SWARMRL_HOME/latest-run`, else None."""
    if LATEST_LINK.is_dir():
        return LATEST_LINK
    recorded = _recorded_run()
    return recorded if recorded is not None and recorded.is_dir() else None


def _recorded_run() -> Path | None:
    """The run `$SWARMRL_HOME/latest-run` names, if any."""
    with contextlib.suppress(OSError):
        if recorded := latest_pointer().read_text().strip():
            return Path(recorded)
    return None


def pid_file(run_dir: Path) -> Path:
    return run_dir / PID_NAME


def start_time(pid: int) -> str | None:
    """The process start time (/proc/PID/stat field 22), or None without /proc. With the pid it
    names one process for good: pids are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def write_pid(run_dir: Path, pid: int | None = None) -> Path:
    """Record the running `swarmrl up` (default: this process) in `<run_dir>/up.pid`."""
    pid = os.getpid() if pid is None else pid
    path = pid_file(run_dir)
    path.write_text(f"{pid} {start_time(pid) or ''}".strip() + "\n")
    return path


def clear_pid(run_dir: Path) -> None:
    """Remove `<run_dir>/up.pid` if it names this process (`swarmrl up`'s final cleanup)."""
    path = pid_file(run_dir)
    with contextlib.suppress(OSError, ValueError, IndexError):
        if int(path.read_text().split()[0]) == os.getpid():
            path.unlink()


def read_pid(path: Path) -> tuple[int, str | None]:
    fields = path.read_text().split()
    return int(fields[0]), (fields[1] if len(fields) > 1 else None)


def pid_candidates(run_dir: Path | None) -> list[Path]:
    """Where `swarmrl down` looks for the pid of the `up` to stop: `run_dir`'s, else the latest runs'
    and the older `runs/.up.pid`."""
    if run_dir is not None:
        return [pid_file(run_dir)]
    runs = [LATEST_LINK if LATEST_LINK.is_dir() else None, _recorded_run()]
    unique: dict[Path, Path] = {}
    for path in [*(pid_file(run) for run in runs if run is not None), LEGACY_PID_FILE]:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def write_service_file(run_dir: Path, url: str) -> Path:
    """Write `<run_dir>/service.json` (owner-only: it holds the service password)."""
    return write_private(run_dir / SERVICE_FILE, json.dumps({"nats": url}))
