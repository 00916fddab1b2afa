"""The sandbox worker ("zygote"), started by `sandbox.PythonSandbox` inside the isolation as
`python -m swarmrl.services.actions.sandbox_zygote CONFIG`. After a first {"ready": true} line it
reads jobs ({"code", "stdin", "limits"}), one JSON line each on stdin, and answers each with one
JSON line on stdout; its own stderr carries only its own failures.

Per job it forks a child that makes a fresh work dir, applies rlimits, drops to the unit's uid
(as root), sets no_new_privs, in rlimit mode installs an audit hook, then runs the code in a fresh
`__main__`. The zygote enforces the wall clock and kills the child's whole tree before it answers.
"""

from __future__ import annotations

import builtins
import contextlib
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

from swarmrl.services.actions.sandbox_host import dirs_between, kill_all, proc_pids, proc_status, process_tree

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_M_ARENA_MAX = -8
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC = 1, 32, 4096, 8192, 16384
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS: dict[str, tuple[int, ...]] = {  # audit event -> indexes of the path arguments it writes
    **dict.fromkeys(("os.mkdir", "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown"), (0,)),
    **dict.fromkeys(("os.utime", "os.mkfifo", "os.mknod"), (0,)),
    **dict.fromkeys(("os.rename", "os.replace"), (0, 1)),
    **dict.fromkeys(("os.link", "os.symlink"), (1,)),
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
            for d in dirs_between(top, path):
                if not os.path.isdir(d):
                    os.mkdir(d)
                    os.chmod(d, 0o755)
            os.makedirs(path, exist_ok=True)
            _mount(stage, path, None, _MS_MOVE)
            _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
            os.rmdir(stage)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else os.fsencode(v) for v in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def _run_job(job: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="job-", dir=config["base"])
    stdin = tempfile.TemporaryFile(dir=config["base"])
    stdin.write(job["stdin"].encode())
    stdin.seek(0)
    pipes = {name: os.pipe() for name in ("stdout", "stderr", "info")}
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(job, workdir, config, (stdin.fileno(), *(w for _, w in pipes.values())))
    stdin.close()
    for _, w in pipes.values():
        os.close(w)
    try:
        return _watch(pid, job["limits"], began, {name: r for name, (r, _) in pipes.items()})
    finally:
        for r, _ in pipes.values():
            os.close(r)
        shutil.rmtree(workdir, ignore_errors=True)


def _watch(pid: int, limits: dict[str, Any], began: float, streams: dict[str, int]) -> dict[str, Any]:
    """Collect the child's output (at most `output_bytes` a stream) until it exits or its wall clock
    is up, kill what it left, and say how it ended."""
    cap = int(limits["output_bytes"])
    data = {name: bytearray() for name in streams}
    truncated = False
    sel = selectors.DefaultSelector()
    for name, fd in streams.items():
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, name)
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)

    def read(key: selectors.SelectorKey) -> None:
        nonlocal truncated
        try:
            chunk = os.read(key.fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            sel.unregister(key.fd)
            return
        buf = data[key.data]
        room = cap - len(buf)
        truncated |= len(chunk) > room
        buf += chunk[: max(room, 0)]

    deadline = began + float(limits["wall_s"])
    exited = False
    while not exited and (left := deadline - time.monotonic()) > 0:
        for key, _ in sel.select(left):
            if key.fd == pidfd:
                exited = True
            else:
                read(key)
    if not exited:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    sel.unregister(pidfd)
    os.close(pidfd)
    leftover_processes = _kill_tree(pid)
    # Every writer is dead now: drain to EOF (bounded, in case something still holds a pipe).
    drain_until = time.monotonic() + 2.0
    while sel.get_map() and time.monotonic() < drain_until:
        for key, _ in sel.select(0.1):
            read(key)
    sel.close()
    cpu_s = usage.ru_utime + usage.ru_stime
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    info = data["info"].decode(errors="replace")
    cause, detail = None, ""
    if not exited:
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
        "leftover_processes": leftover_processes,
    }


def _descendants() -> set[int]:
    """Live processes below us (everything else in our own pid namespace); zombies are reaped."""
    me = os.getpid()
    if me != 1:
        try:
            with open(f"/proc/{me}/task/{me}/children", "rb") as f:
                if not f.read().strip():
                    return set()
        except OSError:
            pass  # no CONFIG_PROC_CHILDREN: scan everything
    return process_tree(me, live=True) - {me}


def _kill_tree(main_child: int | None) -> int:
    """SIGKILL until nothing of the code's is left; returns how many leftovers it killed."""

    def leftovers() -> set[int]:
        _reap()
        return _descendants() - {main_child}

    killed = kill_all(leftovers, rounds=200, pause_s=0.001)
    _reap()
    return killed


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _child(job: dict[str, Any], workdir: str, config: dict[str, Any], fds: tuple[int, ...]) -> None:
    """In the forked child: set up the process (`fds` become its stdin, stdout, stderr and fd 3, the
    zygote's info pipe) and run the code; never returns."""
    info = fds[3]
    try:
        os.setsid()
        for dst, src in enumerate(fds):
            os.dup2(src, dst)
        os.closerange(4, 1 << 16)
        info = 3
        uid = config["uid"]
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chdir(workdir)
        _apply_limits(job["limits"], uid)
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
        os.write(info, f"setup:{e!r}".encode())
        os._exit(125)
    os._exit(_exec(job["code"], main_module.__dict__))


def _apply_limits(limits: dict[str, Any], uid: int | None) -> None:
    mb = 1 << 20
    cpu = math.ceil(limits["cpu_s"])
    with open("/proc/self/statm", "rb") as f:
        vsz = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    nproc = int(limits["nproc"])
    if uid is None:
        # Not root: RLIMIT_NPROC counts all tasks of our uid, so allow ours plus the budget.
        nproc += sum(
            proc_status(p, "Threads") or 0 for p in proc_pids() if proc_status(p, "Uid") == os.getuid()
        )
    for which, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, vsz + int(limits["mem_mb"]) * mb),
        (resource.RLIMIT_FSIZE, int(limits["fsize_mb"]) * mb),
        (resource.RLIMIT_NPROC, nproc),
    ):
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU first, SIGKILL 1 s later
        resource.setrlimit(which, (value, hard))


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
        with contextlib.suppress(BaseException):  # the code's streams may fail any way: its status stands
            stream.flush()
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
