"""Code sandbox resource manager (CPU units): runs untrusted Python in warm, isolated workers.

A unit is one warm worker, a "zygote" (`sandbox_zygote.py`): a Python process started inside the
isolation (bubblewrap, or `unshare` plus rlimits) with common modules imported, which forks a child
per action. The manager replaces a worker that dies or stops answering. What each mode isolates:
README.md; how a worker is launched and cleaned up after: `sandbox_host.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from asyncio.subprocess import PIPE
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from swarmrl.services.actions import sandbox_host as host
from swarmrl.services.actions.model import Outcome, Status
from swarmrl.services.actions.sandbox_host import SandboxError, detect_mode, launch_prefix
from swarmrl.services.common.tasks import Background

log = logging.getLogger(__name__)

MODES = ("auto", "bwrap", "rlimit")
BASE_PRELOAD: tuple[str, ...] = (
    *("ast", "collections", "ctypes", "encodings.idna", "functools", "io", "itertools", "json"),
    *("linecache", "math", "random", "re", "socket", "string", "threading", "time", "tokenize"),
    "traceback",
)
"""Imported by every worker before it forks: warm, and importable even where the dropped uid cannot
read the interpreter's directories (rlimit mode as root, see README)."""
MAX_CODE_BYTES = 1 << 20
START_TIMEOUT_S = 30.0
BACKSTOP_GRACE_S = 5.0
"""The zygote enforces `wall_s` itself; the manager kills a worker silent for `wall_s` + this."""
_WORKER_MODULE = "swarmrl.services.actions.sandbox_zygote"


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one action; the defaults fit a tool call."""

    cpu_s: float = 5.0
    """CPU seconds per process (RLIMIT_CPU, rounded up; SIGKILL one second later)."""
    mem_mb: int = 256
    """Address space the code may map on top of the warm worker's (RLIMIT_AS)."""
    wall_s: float = 10.0
    """Wall-clock limit, enforced by the worker (the manager's backstop: `BACKSTOP_GRACE_S`)."""
    nproc: int = 32
    """Processes plus threads the action may have at once (RLIMIT_NPROC of its own uid)."""
    fsize_mb: int = 16
    """Largest file the code may write (RLIMIT_FSIZE)."""
    output_bytes: int = 64 * 1024
    """Kept of stdout and of stderr each; the rest is dropped (`truncated`)."""

    def check(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")


@dataclass(eq=False)
class _Worker:
    """One unit: a warm zygote process and what the manager knows about it."""

    proc: asyncio.subprocess.Process
    uid: int | None
    lock: int | None
    """The fd of its uid's lock (`claim_uid`)."""
    base: str | None
    reap_tree: bool
    """No pid namespace: kill the zygote's descendants (it is their subreaper) and its uid's
    processes ourselves."""
    retiring: bool = False

    @property
    def dead(self) -> bool:
        return self.proc.returncode is not None

    def kill(self) -> None:
        if self.reap_tree and not self.dead:
            host.kill_all(lambda: host.process_tree(self.proc.pid) - {self.proc.pid})
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def ask(self, job: dict[str, Any] | None, timeout_s: float) -> dict[str, Any] | None:
        """Send `job` (if any) and read the zygote's one-line answer; None when it died, went silent
        or answered garbage (then it is killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            if job is not None:
                self.proc.stdin.write(json.dumps(job).encode() + b"\n")
                await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
            answer = json.loads(line) if line else None
        except (OSError, ValueError, TimeoutError):
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            return None
        return answer


class PythonSandbox:
    """A pool of warm, isolated Python workers, one action on each at a time. `mode`: `auto` (bwrap if
    it works here, else rlimit), `bwrap` or `rlimit`; `preload` adds to `BASE_PRELOAD`."""

    def __init__(
        self, mode: str = "auto", limits: SandboxLimits | None = None, preload: tuple[str, ...] = ()
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
        self.limits = limits or SandboxLimits()
        self.limits.check()
        self.python = sys.executable
        self.preload = BASE_PRELOAD + tuple(preload)
        self.mode = detect_mode(self.python) if mode == "auto" else mode
        self._prefix = launch_prefix(self.mode, self.python)
        self._root = os.geteuid() == 0
        self.counts: Counter[str] = Counter()
        """Outcome statuses, kills by cause (`killed_cpu`, ...) and worker events (`worker_*`)."""
        self._target = 0
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._changed = asyncio.Event()
        """Set when a worker becomes idle or the pool can no longer give one: wakes `_acquire`."""
        self._starting = 0
        self._tasks = Background()
        self._closed = False

    @property
    def isolation(self) -> dict[str, Any]:
        """What this sandbox achieved on this machine (see README for what each line means)."""
        pid_ns = self.mode == "bwrap" or "--pid" in self._prefix
        net_ns = self.mode == "bwrap" or "--net" in self._prefix
        # A dropped uid that cannot traverse the interpreter's directories, with no mount namespace
        # to re-bind them, imports only what was preloaded.
        own_mounts = not self._root or self.mode == "bwrap" or "--mount-proc" in self._prefix
        return {
            "mode": self.mode,
            "filesystem": "read-only root, private /tmp" if self.mode == "bwrap" else "uid + audit hook",
            "network": "network namespace" if net_ns else "audit hook",
            "pid_namespace": pid_ns,
            "uid_per_unit": self._root,
            "imports": "any" if own_mounts or not host.rebinds(self.python, tmp=False) else "preloaded only",
        }

    @property
    def units(self) -> int:
        """Workers alive or starting."""
        return len(self._workers) + self._starting

    def worker_pids(self) -> list[int]:
        """Host pids of the workers' outermost processes (bwrap, unshare or the zygote)."""
        return sorted(w.proc.pid for w in self._workers)

    async def resize(self, units: int) -> None:
        """Grow (and wait until the new workers are ready) or shrink (idle workers now, busy ones
        when their action ends) to `units` workers."""
        if units < 0:
            raise ValueError(f"units must be >= 0, got {units}")
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self._target = units
        grow = units - self.units
        if grow > 0:
            results = await asyncio.gather(*(self._spawn() for _ in range(grow)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise SandboxError(f"{len(errors)} of {grow} sandbox workers failed to start: {errors[0]}")
        while self.units > self._target and self._idle:
            await self._retire(self._idle.pop())

    start = resize  # the resource manager protocol of `workers.Runner`

    async def run(self, code: str, *, limits: SandboxLimits | None = None, stdin: str = "") -> Outcome:
        """Run `code` (a Python script) on a free warm worker. `ok` when it ran to its end (its
        `exit_code` is 1, with a traceback in stderr, when it raised); see `Outcome.status`."""
        limits = limits or self.limits
        try:
            limits.check()
            if not isinstance(code, str) or not isinstance(stdin, str):
                raise ValueError(
                    f"code and stdin must be str, got {type(code).__name__}, {type(stdin).__name__}"
                )
            if len(code.encode()) + len(stdin.encode()) > MAX_CODE_BYTES:
                raise ValueError(f"code + stdin exceed {MAX_CODE_BYTES} bytes")
        except (ValueError, UnicodeError) as e:
            return self._count(Outcome("rejected", error=str(e)))
        try:
            worker = await self._acquire()
        except SandboxError as e:
            return self._count(Outcome("error", error=str(e)))
        job = {"code": code, "stdin": stdin, "limits": asdict(limits)}
        began = time.monotonic()
        answer = None
        try:
            answer = await worker.ask(job, limits.wall_s + BACKSTOP_GRACE_S)
        finally:
            if answer is None:
                worker.kill()  # cancelled or silent mid-action: its state is unknown
            self._release(worker)
        run_s = time.monotonic() - began
        if self._closed:  # whatever the worker said, close() cut this action short
            outcome = Outcome("error", error="the sandbox was closed while the action ran")
        elif answer is not None:
            outcome = _outcome(answer, limits)
        elif run_s >= limits.wall_s:
            outcome = Outcome("timeout", error=f"wall-clock limit of {limits.wall_s:g} s (worker killed)")
        else:
            outcome = Outcome("error", error=f"sandbox worker died (exit {worker.proc.returncode})")
        outcome.run_s = run_s
        return self._count(outcome)

    async def close(self) -> None:
        """Kill every worker and every process of their actions; wait until they are gone."""
        self._closed = True
        self._target = 0
        self._changed.set()
        workers = list(self._workers)
        for w in workers:
            w.retiring = True
            w.kill()
        await asyncio.gather(*(w.proc.wait() for w in workers))
        await self._tasks.close()
        for w in workers:
            self._cleanup(w)
        self._workers.clear()
        self._idle.clear()

    def _count(self, outcome: Outcome) -> Outcome:
        self.counts[outcome.status] += 1
        cause = outcome.result.get("cause")
        if outcome.status == "killed" and cause:
            self.counts[f"killed_{cause}"] += 1
        self.counts["leftover_processes"] += outcome.result.get("leftover_processes", 0)
        return outcome

    async def _acquire(self) -> _Worker:
        while True:
            while self._idle:
                worker = self._idle.pop()
                if not worker.dead:
                    return worker
            if self._closed or not self.units:
                why = "the sandbox is closed" if self._closed else "no sandbox worker to run on"
                raise SandboxError(f"{why} ({self.units} units, target {self._target})")
            self._changed.clear()
            await self._changed.wait()

    def _release(self, worker: _Worker) -> None:
        if worker.dead or worker.retiring or worker not in self._workers:
            return  # the watcher replaces or forgets it
        if self.units > self._target:
            self._tasks.spawn(self._retire(worker))
            return
        self._idle.append(worker)
        self._changed.set()

    async def _spawn(self, replacing: bool = False) -> None:
        self._starting += 1
        try:
            worker = await self._start_worker()
        except BaseException:  # cancelled too: waiters re-check whether a worker is left, then it propagates
            self.counts["worker_start_failed"] += 1
            self._changed.set()
            raise
        finally:
            self._starting -= 1
        self._workers.add(worker)
        self.counts["worker_started"] += 1
        if replacing:
            self.counts["worker_replaced"] += 1
        self._tasks.spawn(self._watch(worker))
        self._release(worker)

    async def _start_worker(self) -> _Worker:
        uid, lock = host.claim_uid() if self._root else (None, None)
        rlimit = self.mode == "rlimit"
        base = tempfile.mkdtemp(prefix="swarmrl-sandbox-") if rlimit else None
        if base:
            os.chmod(base, 0o711)  # the dropped uid must reach its job dir inside
        # rlimit mode, root, own mount namespace: the zygote hides dirs the dropped uid cannot
        # traverse (e.g. /root holding a pyenv) under a tmpfs with the interpreter bound back.
        mount_ns = rlimit and self._root and "--mount-proc" in self._prefix
        config = {
            "uid": uid, "base": base or "/tmp", "preload": list(self.preload), "guard": rlimit,
            "guard_net": rlimit and "--net" not in self._prefix,
            "rebind": host.rebinds(self.python, tmp=False) if mount_ns else {},
        }  # fmt: skip
        argv = [*self._prefix, self.python, "-m", _WORKER_MODULE, json.dumps(config)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, env=host.worker_env(), cwd=base or "/",
                start_new_session=True, limit=16 << 20,
            )  # fmt: skip
        except BaseException:  # cancelled too: its uid lock and base dir are freed, then it propagates
            if lock is not None:
                os.close(lock)
            if base:
                host.rmtree(base)
            raise
        worker = _Worker(proc, uid, lock, base, reap_tree=rlimit and "--pid" not in self._prefix)
        try:
            info = await worker.ask(None, START_TIMEOUT_S)
            if info is None or info.get("ready") is not True:  # it exits, or `ask` killed it
                assert proc.stderr is not None
                err = b""
                with contextlib.suppress(TimeoutError):
                    err = await asyncio.wait_for(proc.stderr.read(4000), 5)
                raise SandboxError(f"sandbox worker did not start ({info or 'no answer'}): {err.decode()!r}")
        except BaseException:  # cancelled too: the half-started worker is killed, then it propagates
            worker.kill()
            await proc.wait()
            self._cleanup(worker)
            raise
        return worker

    async def _watch(self, worker: _Worker) -> None:
        assert worker.proc.stderr is not None
        async for line in worker.proc.stderr:  # the zygote's own complaints, not the code's output
            log.warning("sandbox worker %d: %s", worker.proc.pid, line.decode(errors="replace").rstrip())
        await worker.proc.wait()
        self._workers.discard(worker)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)
        self._cleanup(worker)
        if worker.retiring or self._closed:
            return
        self.counts["worker_died"] += 1
        log.warning("sandbox worker %d died (exit %s); replacing it", worker.proc.pid, worker.proc.returncode)
        if self.units < self._target:
            with contextlib.suppress(SandboxError):
                await self._spawn(replacing=True)

    async def _retire(self, worker: _Worker) -> None:
        worker.retiring = True
        self._workers.discard(worker)
        if worker.proc.stdin is not None:
            worker.proc.stdin.close()  # EOF: the zygote kills its leftovers and exits
        try:
            await asyncio.wait_for(worker.proc.wait(), 2)
        except TimeoutError:
            worker.kill()
            await worker.proc.wait()

    def _cleanup(self, worker: _Worker) -> None:
        if worker.reap_tree and worker.uid is not None:
            self.counts["leftover_processes"] += host.kill_uid(worker.uid)
            worker.uid = None
        if worker.base:
            host.rmtree(worker.base)
            worker.base = None
        if worker.lock is not None:
            os.close(worker.lock)  # only now: its uid's leftovers are gone
            worker.lock = None


def _outcome(answer: dict[str, Any], limits: SandboxLimits) -> Outcome:
    keys = ("stdout", "stderr", "exit_code", "signal", "cpu_s", "truncated", "leftover_processes", "cause")
    result = {k: answer.get(k) for k in keys}
    ends: dict[str | None, tuple[Status, str]] = {
        "timeout": ("timeout", f"wall-clock limit of {limits.wall_s:g} s"),
        "cpu": ("killed", f"killed: CPU time limit of {math.ceil(limits.cpu_s)} s"),
        "memory": ("killed", f"killed: memory limit of {limits.mem_mb} MB"),
        "nproc": ("killed", f"killed: process limit of {limits.nproc} processes"),
        "signal": ("killed", f"killed by {answer.get('signal')}"),
        "setup": ("error", f"sandbox setup failed: {answer.get('detail')}"),
    }
    status, error = ends.get(result["cause"], ("ok", ""))
    return Outcome(status, result, error)
