"""The host side of the code sandbox (`sandbox.py`): which isolation works on this machine, the command
a worker starts under (bubblewrap's, `unshare`'s or none), the uids its actions run as, and killing
what they leave behind (from /proc)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from typing import Any

UID_BASE = 62000
"""As root, each unit's actions run as a uid of their own from here (one /etc/passwd does not name),
locked host-wide while the unit lives: RLIMIT_NPROC and the cleanup by uid never mix two units."""
UID_COUNT = 4096
UID_LOCK_DIRS = ("/run/swarmrl-sandbox", os.path.join(tempfile.gettempdir(), "swarmrl-sandbox-uids"))
TMPFS_MB = 256
"""bwrap mode: size of a worker's private, RAM-backed /tmp (RLIMIT_FSIZE only bounds one file)."""
_PATHS_QUERY = (
    "import importlib.util, json, sys\n"
    "paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sys.path]\n"
    "for name in ('swarmrl', 'swarmrl.agents', 'swarmrl.services', 'swarmrl.schemas', 'swarmrl.infra'):\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    paths += list(spec.submodule_search_locations or []) if spec else []\n"
    "print(json.dumps(paths))\n"
)


class SandboxError(RuntimeError):
    """The sandbox cannot start or run workers (bad mode, broken isolation, no worker left)."""


@functools.cache
def probe(prefix: tuple[str, ...], python: str) -> bool:
    """Does `python` run here under the isolation `prefix`?"""
    argv = [*prefix, python, "-c", "print('ok')"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, check=False, env=worker_env())
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == b"ok"


@functools.cache
def interpreter_paths(python: str) -> tuple[str, ...]:
    """Directories `python` needs readable: prefixes, sys.path, the swarmrl package folders."""
    out = subprocess.run([python, "-c", _PATHS_QUERY], capture_output=True, check=True, env=worker_env())
    paths = {os.path.dirname(os.path.realpath(python)), os.path.dirname(os.path.abspath(python))}
    paths |= {os.path.realpath(p) for p in json.loads(out.stdout) if p}
    return tuple(sorted(p for p in paths if os.path.exists(p)))


def hidden_top(path: str) -> str | None:
    """The topmost ancestor of `path` that the sandbox hides: /tmp (a fresh tmpfs there) or a
    directory an unprivileged uid cannot traverse (e.g. /root 0700 holding a pyenv)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        top = "/" + "/".join(parts[:i])
        if top == "/tmp" or not os.stat(top).st_mode & stat.S_IXOTH:
            return top
    return None


def rebinds(python: str, tmp: bool) -> dict[str, list[str]]:
    """Hidden tops (see `hidden_top`) -> the interpreter's paths under them to bind back."""
    tops: dict[str, set[str]] = {"/tmp": set()} if tmp else {}
    for path in interpreter_paths(python):
        top = hidden_top(path)
        if top and (tmp or top != "/tmp"):
            tops.setdefault(top, set()).add(path)
    return {
        top: [p for p in sorted(paths) if not any(p.startswith(other + "/") for other in paths)]
        for top, paths in sorted(tops.items())
    }


def dirs_between(top: str, path: str) -> list[str]:
    """The directories strictly between `top` and `path` (which is below it), outermost first."""
    out = []
    while (path := os.path.dirname(path)) not in (top, "/"):
        out.append(path)
    return out[::-1]


def bwrap_argv(bwrap: str, python: str) -> list[str]:
    """A read-only view of the host; hidden tops become empty tmpfs with only the interpreter's paths
    bound back, so the dropped uid can import and /root's secrets stay hidden."""
    argv = [bwrap, "--ro-bind", "/", "/"]
    for top, paths in rebinds(python, tmp=True).items():
        size = ["--size", str(TMPFS_MB << 20)] if top == "/tmp" else []
        argv += ["--perms", "0755", *size, "--tmpfs", top]
        made = {top}
        for path in paths:
            for d in dirs_between(top, path):
                if d not in made:  # bwrap would make it 0700: unreachable after the uid drop
                    argv += ["--perms", "0755", "--dir", d]
                    made.add(d)
            argv += ["--ro-bind", path, path]
    argv += ["--dev", "/dev", "--proc", "/proc", "--unshare-net", "--unshare-pid", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1"]
    return [*argv, "--chdir", "/tmp", "--"]


def launch_prefix(mode: str, python: str) -> list[str]:
    """The command put before the worker's `python`: bwrap's, `unshare`'s, or nothing."""
    if mode == "bwrap":
        bwrap = shutil.which("bwrap")
        if not bwrap:
            raise SandboxError("mode 'bwrap' asked for, but no bwrap on PATH (Debian package bubblewrap)")
        return bwrap_argv(bwrap, python)
    unshare = shutil.which("unshare")
    if not unshare:
        return []
    net = [unshare, "--net"] if os.geteuid() == 0 else [unshare, "--user", "--net"]
    for prefix in ([*net, "--pid", "--fork", "--kill-child", "--mount-proc"], net):
        if probe(tuple(prefix), python):
            return prefix
    return []


@functools.cache
def detect_mode(python: str = sys.executable) -> str:
    """`bwrap` when bubblewrap is installed and a probe run inside it works, else `rlimit`."""
    bwrap = shutil.which("bwrap")
    if bwrap and probe(tuple(bwrap_argv(bwrap, python)), python):
        return "bwrap"
    return "rlimit"


def worker_env() -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def has_name(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def lock_dir() -> str:
    for path in UID_LOCK_DIRS:
        with contextlib.suppress(OSError):
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
                return path
    raise SandboxError(f"no safe directory for the sandbox's uid locks among {UID_LOCK_DIRS}")


def claim_uid() -> tuple[int, int]:
    """A sandbox uid no other unit on this host holds, and the fd of its lock (close to free it)."""
    locks = lock_dir()
    for uid in (u for u in range(UID_BASE, UID_BASE + UID_COUNT) if not has_name(u)):
        fd = os.open(os.path.join(locks, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        kill_uid(uid)  # strays of a unit whose manager died without cleaning up
        return uid, fd
    raise SandboxError(f"all sandbox uids from {UID_BASE} to {UID_BASE + UID_COUNT - 1} are in use")


def kill_all(find: Callable[[], Collection[int]], rounds: int = 50, pause_s: float = 0.0) -> int:
    """SIGKILL what `find` lists until it lists nothing (at most `rounds` times); how many it killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = find()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(pause_s)
    return len(killed)


def kill_uid(uid: int) -> int:
    """Kill every host process of `uid` (as root): what a killed worker's action left where no pid
    namespace took it down with the worker."""
    return kill_all(lambda: [pid for pid in proc_pids() if proc_status(pid, "Uid") == uid])


def process_tree(root: int, live: bool = False) -> set[int]:
    """`root` and its descendants, from /proc (`live`: zombies left out)."""
    parents = {}
    for pid in proc_pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{pid}/stat", "rb") as f:
                state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
            if not live or state != b"Z":
                parents[pid] = int(ppid)
    found = {root}
    while grown := {pid for pid, ppid in parents.items() if ppid in found and pid not in found}:
        found |= grown
    return found


def proc_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def proc_status(pid: int, field: str) -> int | None:
    """The (first) number of a field of /proc/<pid>/status (`Uid`, `Threads`); None if it is gone."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(field.encode() + b":"):
                return int(line.split()[1])
    return None


def rmtree(path: str) -> None:
    """Remove a worker's base dir, also where the code took permissions off its own subdirs (not
    root). Never touches anything above `path`."""
    if not os.path.isdir(path):
        return
    root = os.path.realpath(path)

    def unlock(func: Any, p: str, _exc: Any) -> None:
        for d in (os.path.dirname(p), p):
            if os.path.realpath(d).startswith(root + os.sep) or os.path.realpath(d) == root:
                with contextlib.suppress(OSError):
                    os.chmod(d, 0o700)
        with contextlib.suppress(OSError):
            func(p)

    shutil.rmtree(path, onerror=unlock)
    shutil.rmtree(path, ignore_errors=True)
