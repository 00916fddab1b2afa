"""Run directories, the "latest run" pointers, and the pid and service files of a running `up`.

Where runs live and how the tools find them again, from any directory:

- `make_run_dir(arg)` creates the run directory (`--run-dir`, default `runs/<timestamp>` under the
  current directory) and records it as the latest run in two places:
    * `$SWARMRL_HOME/latest-run` (default `~/.cache/swarmrl/latest-run`): a one-line text file with
      the run's absolute path, rewritten atomically. It always names the last run started on this
      machine (per `$SWARMRL_HOME`), wherever its directory is.
    * `runs/latest` in the current directory: a symlink to the run. It is created when the run is
      under `./runs/` (the default), and repointed when it already exists as a symlink, so in a
      project directory it names the last run started from there, also with `--run-dir elsewhere`.
      A `runs/latest` that is not a symlink is never touched, and nothing is created beside a
      `--run-dir` outside `./runs/` (a `latest` there would be a stray file next to the run).
- `latest_run_dir()` is what readers (`swarmrl query`, `swarmrl down`) use: `./runs/latest` when
  it exists (the local project's view wins), else the run named by `$SWARMRL_HOME/latest-run` when
  that directory still exists, else None.
- `write_pid(run_dir)` / `clear_pid(run_dir)`: `swarmrl up` keeps `<run_dir>/up.pid` while it runs
  (the pid and the process start time, so a pid the kernel has since reused is never signalled).
- `write_service_file(run_dir, url)`: `swarmrl up` writes the swarm's service URL, owner-only, to
  `<run_dir>/service.json`, where `swarmrl clients`, `status` and `down` find it on this machine
  (elsewhere they take `$SWARMRL_NATS`).
- `read_pid` / `pid_candidates`: where `swarmrl down` (`swarmrl.clients.down`) looks for the pid of
  the `swarmrl up` to stop: DIR's, or the latest run's found as above (falling back to the older
  `runs/.up.pid` of the current directory).

Stdlib only: the CLI imports this for `swarmrl down` and `swarmrl query`, which must start fast.
"""

from __future__ import annotations

import contextlib
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
    """`$SWARMRL_HOME`, else `~/.cache/swarmrl`: where models are cached and the latest run is
    recorded (this module imports only the standard library, so `down` and `query` start fast)."""
    return Path(os.environ.get("SWARMRL_HOME") or Path.home() / ".cache" / "swarmrl")


def latest_pointer() -> Path:
    """The file recording the last run started on this machine: `$SWARMRL_HOME/latest-run`."""
    return swarmrl_home() / LATEST_POINTER


def make_run_dir(arg: Path | None) -> Path:
    """Create the run directory and record it as the latest run (see the module docstring).

    Args:
        arg: `--run-dir`, or None for `runs/<timestamp>` under the current directory.

    Returns:
        The run directory as given (relative paths stay relative), created with its parents.
    """
    run_dir = arg or RUNS / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir.resolve()
    with contextlib.suppress(OSError):
        _write_pointer(latest_pointer(), target)
    _update_local_link(target)
    return run_dir


def _write_pointer(pointer: Path, target: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    # Atomic: a reader never sees a half-written path, and two `up`s racing leave one whole answer.
    fd, tmp = tempfile.mkstemp(dir=pointer.parent, prefix=f".{pointer.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{target}\n")
        os.replace(tmp, pointer)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _update_local_link(target: Path) -> None:
    link = LATEST_LINK
    if link.is_symlink():
        pass  # ours to repoint, whatever run it names
    elif link.exists():
        log.warning("not updating %s: it is not a symlink", link)
        return
    elif not target.is_relative_to(RUNS.resolve()):
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
    try:
        recorded = latest_pointer().read_text().strip()
    except OSError:
        return None
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    return None


def pid_file(run_dir: Path) -> Path:
    return run_dir / PID_NAME


def start_time(pid: int) -> str | None:
    """The process start time (clock ticks since boot, /proc/PID/stat field 22), or None where
    /proc is not there. With the pid it names one process for good: pids are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def write_pid(run_dir: Path, pid: int | None = None) -> Path:
    """Record the running `swarmrl up` (default: this process) in `<run_dir>/up.pid`.

    `swarmrl up` calls it right after `make_run_dir`, before starting any service.
    """
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
    if run_dir is not None:
        return [pid_file(run_dir)]
    found: list[Path] = []
    if LATEST_LINK.is_dir():
        found.append(pid_file(LATEST_LINK))
    with contextlib.suppress(OSError):
        recorded = latest_pointer().read_text().strip()
        if recorded:
            found.append(pid_file(Path(recorded)))
    found.append(LEGACY_PID_FILE)  # written by `swarmrl up` before run-dir pid files
    unique: dict[Path, Path] = {}
    for path in found:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def write_service_file(run_dir: Path, url: str) -> Path:
    """Write `<run_dir>/service.json` (mode 0600 from its creation: it holds the service password)."""
    import json

    path = run_dir / SERVICE_FILE
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"nats": url}, f)
    return path
