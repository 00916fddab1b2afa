"""The sandbox worker ("zygote"): runs inside the isolation, one action at a time.

Started by `sandbox.PythonSandbox` as `python -m swarmrl.services.actions.sandbox_zygote CONFIG`.
Consumes jobs, one JSON line each on stdin ({"code", "stdin", "limits"}); publishes one JSON line
per job on stdout (stdout, stderr, exit_code, signal, cpu_s, truncated, cause, leftovers), after a
first {"ready": true} line. Its own stderr carries only its own failures.

Per job it forks a child that: starts its own session, makes a fresh work dir and chdirs there,
applies RLIMIT_CPU/AS/NPROC/FSIZE/CORE, drops to the unit's uid when root, sets no_new_privs, in
rlimit mode installs audit hooks (writes outside the work dir, sockets, new programs), then execs
the code in a fresh `__main__`. The zygote enforces the wall clock and kills the child's whole
tree (everything else in its pid namespace, or all its descendants) before it answers.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import importlib
import json
import math
import os
import resource
import selectors
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_M_ARENA_MAX = -8
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC = 1, 32, 4096, 8192, 16384
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {  # audit event -> indexes of the path arguments it writes
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.link": (1,),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
}
_EXEC_EVENTS = ("os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "pty.spawn")
_CTYPES_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function")

_libc = ctypes.CDLL(None, use_errno=True)


def main(config: dict[str, Any]) -> None:
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]  # `-m` put our cwd there; the code gets its work dir instead
    sys.dont_write_bytecode = True
    _libc.mallopt(_M_ARENA_MAX, 2)  # fewer 64 MB malloc arenas: threads fit in RLIMIT_AS
    if os.getpid() != 1:  # no pid namespace: orphans of the code must come back to us
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _rebind(config["rebind"], config["base"])
    ready: dict[str, Any] = {"ready": True, "pid": os.getpid(), "pid_ns": os.getpid() == 1}
    try:
        for name in config["preload"]:
            importlib.import_module(name)
    except Exception as e:  # any error of any module: reported to the manager instead of dying silently
        ready = {"ready": False, "error": f"preload failed: {e!r}"}
    _send(proto_out, ready)
    if not ready["ready"]:
        return
    while line := proto_in.readline():
        _send(proto_out, _run_job(json.loads(line), config))
    _kill_tree(None)


def _rebind(tops: dict[str, list[str]], base: str) -> None:
    """In our own mount namespace (as root): put a 0755 tmpfs over each hidden top and move the
    interpreter's paths back onto it, read-only. What bwrap does with --tmpfs and --ro-bind."""
    for top, paths in tops.items():
        staged = []
        for path in paths:
            stage = tempfile.mkdtemp(dir=base)
            _mount(path, stage, None, _MS_BIND | _MS_REC)
            staged.append((stage, path))
        _mount("tmpfs", top, "tmpfs", 0, "mode=0755")
        for stage, path in staged:
            for d in reversed([p for p in _parents(path) if p.startswith(top + "/")]):
                if not os.path.isdir(d):
                    os.mkdir(d)
                    os.chmod(d, 0o755)
            os.makedirs(path, exist_ok=True)
            _mount(stage, path, None, _MS_MOVE)
            _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
            os.rmdir(stage)


def _parents(path: str) -> list[str]:
    out = []
    while (path := os.path.dirname(path)) != "/":
        out.append(path)
    return out


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else os.fsencode(v) for v in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def _run_job(job: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    limits = job["limits"]
    base = config["base"]
    workdir = tempfile.mkdtemp(prefix="job-", dir=base)
    fd, stdin_path = tempfile.mkstemp(prefix="stdin-", dir=base)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(job["stdin"])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    info_r, info_w = os.pipe()
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(job["code"], workdir, stdin_path, limits, config, (out_w, err_w, info_w))
    for w in (out_w, err_w, info_w):
        os.close(w)
    try:
        answer = _watch(pid, limits, began, {out_r: "stdout", err_r: "stderr", info_r: "info"})
    finally:
        for r in (out_r, err_r, info_r):
            os.close(r)
        os.unlink(stdin_path)
        shutil.rmtree(workdir, ignore_errors=True)
    return answer


def _watch(pid: int, limits: dict[str, Any], began: float, streams: dict[int, str]) -> dict[str, Any]:
    cap = int(limits["output_bytes"])
    data = {name: bytearray() for name in streams.values()}
    truncated = False
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)

    def read(fd: int) -> bool:
        nonlocal truncated
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            sel.unregister(fd)
            return False
        buf = data[streams[fd]]
        room = cap - len(buf)
        truncated |= len(chunk) > room
        buf += chunk[: max(room, 0)]
        return True

    deadline = began + float(limits["wall_s"])
    timed_out = False
    exited = False
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            if key.fd == pidfd:
                exited = True
            else:
                read(int(key.fd))
    if timed_out:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _, status, usage = os.wait4(pid, 0)
    sel.unregister(pidfd)
    os.close(pidfd)
    leftovers = _kill_tree(pid)
    # Every writer is dead now: drain to EOF (bounded, in case something still holds a pipe).
    drain_until = time.monotonic() + 2.0
    while len(sel.get_map()) and time.monotonic() < drain_until:
        for key, _ in sel.select(0.1):
            read(int(key.fd))
    sel.close()
    cpu_s = usage.ru_utime + usage.ru_stime
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    info = data["info"].decode(errors="replace")
    cause = None
    detail = ""
    if timed_out:
        cause = "timeout"
    elif info.startswith("setup:"):
        cause, detail = "setup", info[len("setup:") :]
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= math.ceil(limits["cpu_s"])):
        cause = "cpu"
    elif "memory" in info or "nproc" in info:  # forked copies of the code may each have written
        cause = "memory" if "memory" in info else "nproc"
    elif sig is not None:
        cause = "signal"
    return {
        "stdout": data["stdout"].decode(errors="replace"),
        "stderr": data["stderr"].decode(errors="replace"),
        "exit_code": -sig if sig is not None else os.WEXITSTATUS(status),
        "signal": signal.Signals(sig).name if sig is not None else None,
        "cpu_s": round(cpu_s, 4),
        "truncated": truncated,
        "cause": cause,
        "detail": detail,
        "leftovers": leftovers,
    }


def _descendants() -> list[int]:
    """Live processes below us (excluding zombies, which are reaped instead)."""
    me = os.getpid()
    if me != 1:
        try:
            with open(f"/proc/{me}/task/{me}/children", "rb") as f:
                if not f.read().strip():
                    return []
        except OSError:
            pass  # no CONFIG_PROC_CHILDREN: scan everything
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            parents[int(name)] = int(fields[1])
    if me == 1:  # our own pid namespace: everything but us is the code's
        return [p for p in parents if p != 1]
    found = []
    for pid in parents:
        p = pid
        for _ in range(64):
            p = parents.get(p, 0)
            if p == me:
                found.append(pid)
                break
            if p <= 1:
                break
    return found


def _kill_tree(main_child: int | None) -> int:
    """SIGKILL until nothing of the code's is left; returns how many leftovers it killed."""
    killed: set[int] = set()
    for _ in range(200):
        _reap()
        pids = [p for p in _descendants() if p != main_child]
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except ProcessLookupError:
                pass
        time.sleep(0.001)
    _reap()
    return len(killed)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# ---- in the forked child ----


def _child(
    code: str,
    workdir: str,
    stdin_path: str,
    limits: dict[str, Any],
    config: dict[str, Any],
    fds: tuple[int, int, int],
) -> None:
    out_w, err_w, info_w = fds
    try:
        os.setsid()
        _setup_fds(stdin_path, out_w, err_w, info_w)
        info_w = 3
        uid = config["uid"]
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chdir(workdir)
        _apply_limits(limits, uid)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        os.environ.clear()
        os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=workdir, TMPDIR=workdir, LANG="C.UTF-8")
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
        sys.argv = ["<action>"]
        sys.path.insert(0, workdir)
        main_module = types.ModuleType("__main__")
        main_module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main_module
        if config["guard"]:
            sys.addaudithook(_guard(os.path.realpath(workdir), config["guard_net"]))
    except BaseException as e:  # any failure: the child reports it and exits, never returns to the loop
        os.write(info_w, f"setup:{e!r}".encode())
        os._exit(125)
    os._exit(_exec(code, main_module.__dict__))


def _setup_fds(stdin_path: str, out_w: int, err_w: int, info_w: int) -> None:
    stdin_fd = os.open(stdin_path, os.O_RDONLY)
    for src, dst in ((stdin_fd, 0), (out_w, 1), (err_w, 2), (info_w, 3)):
        os.dup2(src, dst)
    os.closerange(4, 1 << 16)


def _apply_limits(limits: dict[str, Any], uid: int | None) -> None:
    mb = 1 << 20
    cpu = math.ceil(limits["cpu_s"])
    with open("/proc/self/statm", "rb") as f:
        vsz = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    nproc = int(limits["nproc"])
    if uid is None:
        # Not root: RLIMIT_NPROC counts all tasks of our uid, so allow ours plus the budget.
        nproc += _tasks_of(os.getuid())
    for which, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, vsz + int(limits["mem_mb"]) * mb),
        (resource.RLIMIT_FSIZE, int(limits["fsize_mb"]) * mb),
        (resource.RLIMIT_NPROC, nproc),
    ):
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU first, SIGKILL 1 s later
        resource.setrlimit(which, (value, hard))


def _tasks_of(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                count += int(fields[b"Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return count


def _guard(workdir: str, block_net: bool) -> Any:
    """An audit hook: refuse writes outside `workdir`, new programs, ctypes and (optionally)
    sockets. A weak guard: code can still escape through paths it does not see (dir_fd, a
    C extension); see README."""
    allowed = (workdir, os.devnull)

    def outside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False  # an fd the code already holds
        full = os.path.realpath(os.fsdecode(path))
        return not (full in allowed or full.startswith(workdir + os.sep))

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
            if writes and outside(path):
                raise PermissionError(errno.EACCES, "sandbox: no writes outside the work dir", path)
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and outside(args[i]):
                    raise PermissionError(errno.EACCES, "sandbox: no writes outside the work dir", args[i])
        elif event.startswith(_EXEC_EVENTS) or event in _CTYPES_EVENTS:
            raise PermissionError(errno.EPERM, f"sandbox: {event} is not allowed in rlimit mode")
        elif block_net and event.startswith("socket."):
            raise PermissionError(errno.EPERM, f"sandbox: network is disabled ({event})")

    return hook


def _exec(code: str, namespace: dict[str, Any]) -> int:
    status = 0
    try:
        exec(compile(code, "<action>", "exec"), namespace)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException as e:  # whatever the untrusted code raises is its result, not the worker's failure
        marker = _marker(e)
        if marker:
            os.write(3, marker)
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # drop our own frame
        try:
            traceback.print_exception(type(e), e, tb)
        except BaseException:  # printing it may fail any way too (the code broke sys.stderr, no memory)
            os.write(2, f"{type(e).__name__}: {e}\n".encode(errors="replace"))
        status = 1
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # the code's streams may fail to flush any way: the exit status stands
            pass
    return status & 0xFF


def _marker(e: BaseException) -> bytes:
    if isinstance(e, MemoryError):
        return b"memory"
    if isinstance(e, BlockingIOError) and e.errno == errno.EAGAIN:
        return b"nproc"  # fork() or clone() at RLIMIT_NPROC
    if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
        return b"nproc"
    return b""


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
