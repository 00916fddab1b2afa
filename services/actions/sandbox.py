"""Code sandbox resource manager (CPU units): runs untrusted Python in warm, isolated workers.

Consumes `PythonSandbox.run(code)` calls from the actions service (one call = one action holding one
CPU unit); returns one `Outcome` per call (`result`: stdout, stderr, exit_code, signal, cpu_s,
truncated, leftover_processes). No NATS here.

A unit is one warm worker, a "zygote": a Python process started inside the isolation (bubblewrap,
or `unshare` plus rlimits) with the common modules already imported. It reads one job at a time as a
JSON line on stdin and forks a child per job; the child makes a fresh work dir, applies rlimits,
drops to an unprivileged uid of its own when we are root, and runs the code. The zygote captures the
output, enforces the wall clock, kills whatever the code left behind and answers one JSON line. The
manager replaces a worker that dies or stops answering. What each mode isolates: README.md here;
how a worker is launched and cleaned up after on this host: `sandbox_host.py`.
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
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from swarmrl.services.actions.model import Outcome
from swarmrl.services.actions.sandbox_host import (
    SandboxError,
    claim_uid,
    detect_mode,
    kill_uid,
    launch_prefix,
    process_tree,
    rebinds,
    rmtree,
    worker_env,
)
from swarmrl.services.common.tasks import Background

__all__ = ["MODES", "PythonSandbox", "SandboxError", "SandboxLimits", "detect_mode"]

log = logging.getLogger(__name__)

MODES = ("auto", "bwrap", "rlimit")
BASE_PRELOAD: tuple[str, ...] = (
    *("ast", "collections", "ctypes", "encodings.idna", "functools", "io", "itertools", "json"),
    *("linecache", "math", "random", "re", "socket", "string", "threading", "time", "tokenize"),
    "traceback",
)
"""Imported by every worker before it forks: warm for the code, and importable even where the
dropped uid cannot read the interpreter's directories (rlimit mode as root, see README)."""
MAX_CODE_BYTES = 1 << 20
START_TIMEOUT_S = 30.0
BACKSTOP_GRACE_S = 5.0
"""The zygote enforces `wall_s` itself; the manager kills a worker silent for `wall_s` + this."""
_WORKER_MODULE = "swarmrl.services.actions.sandbox_zygote"


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one action. The defaults fit a tool call: a short script, a small computation."""

    cpu_s: float = 5.0
    """CPU seconds per process (RLIMIT_CPU, rounded up; SIGKILL one second later)."""
    mem_mb: int = 256
    """Address space the code may map on top of the warm worker's (RLIMIT_AS); threads count too."""
    wall_s: float = 10.0
    """Wall-clock limit, enforced by the worker (and by the manager as a backstop)."""
    nproc: int = 32
    """Processes plus threads the action may have at once (RLIMIT_NPROC of its own uid)."""
    fsize_mb: int = 16
    """Largest file the code may write (RLIMIT_FSIZE)."""
    output_bytes: int = 64 * 1024
    """Kept of stdout and of stderr each; the rest is read and dropped (`truncated`)."""

    def check(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")


# ---- the manager ----


class _Worker:
    """One unit: a warm zygote process and what the manager knows about it."""

    def __init__(self, proc: asyncio.subprocess.Process, uid: int | None, lock: int | None, base: str | None):
        self.proc = proc
        self.reap_tree = False
        """No pid namespace: kill the zygote's descendants (it is their subreaper) before it."""
        self.uid = uid
        self.lock = lock
        self.base = base
        self.retiring = False
        self.info: dict[str, Any] = {}

    @property
    def dead(self) -> bool:
        return self.proc.returncode is not None

    def kill(self) -> None:
        for _ in range(50 if self.reap_tree and not self.dead else 0):
            pids = process_tree(self.proc.pid) - {self.proc.pid}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def execute(self, job: dict[str, Any], backstop_s: float) -> dict[str, Any] | None:
        """The zygote's answer, or None when it died or went silent (then it is killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), backstop_s)
            answer = json.loads(line) if line else None
        except (OSError, ValueError, TimeoutError):
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            return None
        return answer


class PythonSandbox:
    """A pool of warm, isolated Python workers; one action runs on one worker at a time.

    Args:
        mode: `auto` (bwrap if it works here, else rlimit), `bwrap` or `rlimit`.
        limits: default limits of an action; `run(limits=...)` overrides them per action.
        python: the interpreter of the workers (must have swarmrl installed).
        preload: modules every worker imports before its first action (on top of `BASE_PRELOAD`).
    """

    def __init__(
        self,
        mode: str = "auto",
        limits: SandboxLimits | None = None,
        python: str = sys.executable,
        preload: tuple[str, ...] = (),
    ):
        if mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
        self.limits = limits or SandboxLimits()
        self.limits.check()
        self.python = python
        self.preload = BASE_PRELOAD + tuple(preload)
        self.mode = detect_mode(python) if mode == "auto" else mode
        self._prefix = launch_prefix(self.mode, python)
        self._root = os.geteuid() == 0
        self.counts: Counter[str] = Counter()
        """Outcome statuses, kills by cause (`killed_cpu`, ...) and worker events (`worker_*`)."""
        self._target = 0
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._waiters: list[asyncio.Future[_Worker]] = []
        self._starting = 0
        self._tasks = Background()
        self._closed = False

    @property
    def isolation(self) -> dict[str, Any]:
        """What this sandbox achieved on this machine (see README for what each line means)."""
        pid_ns = self.mode == "bwrap" or "--pid" in self._prefix
        net_ns = self.mode == "bwrap" or "--net" in self._prefix
        return {
            "mode": self.mode,
            "filesystem": "read-only root, private /tmp" if self.mode == "bwrap" else "uid + audit hook",
            "network": "network namespace" if net_ns else "audit hook",
            "pid_namespace": pid_ns,
            "uid_per_unit": self._root,
            "imports": "any" if self._imports_reach() else "preloaded only",
        }

    def _imports_reach(self) -> bool:
        """Can the code import modules not preloaded? Not when it runs as a dropped uid that cannot
        traverse the interpreter's directories and no mount namespace re-binds them (see README)."""
        if not self._root or self.mode == "bwrap" or "--mount-proc" in self._prefix:
            return True
        return not rebinds(self.python, tmp=False)

    @property
    def units(self) -> int:
        """Workers alive or starting."""
        return len(self._workers) + self._starting

    def worker_pids(self) -> list[int]:
        """Host pids of the workers' outermost processes (bwrap, unshare or the zygote)."""
        return sorted(w.proc.pid for w in self._workers)

    async def start(self, units: int) -> None:
        """Start `units` warm workers; returns when they are ready."""
        await self.resize(units)

    async def resize(self, units: int) -> None:
        """Grow (start warm workers, wait until ready) or shrink (stop idle workers now, busy ones
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

    async def run(self, code: str, *, limits: SandboxLimits | None = None, stdin: str = "") -> Outcome:
        """Run `code` (a Python script, passed as data) on a free warm worker.

        Returns `ok` when it ran to its end (`result.exit_code` says whether the code succeeded: 1
        with a traceback in stderr when it raised), `timeout` past `wall_s`, `killed` past the CPU,
        memory or process limit, `rejected` for bad input, `error` when the worker failed.
        """
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
            answer = await worker.execute(job, limits.wall_s + BACKSTOP_GRACE_S)
        finally:
            if answer is None:
                worker.kill()  # cancelled or silent mid-action: its state is unknown
            self._release(worker)
        run_s = time.monotonic() - began
        if self._closed:  # whatever the worker said, close() cut this action short
            return self._count(
                Outcome("error", error="the sandbox was closed while the action ran", run_s=run_s)
            )
        if answer is None:
            if run_s >= limits.wall_s:
                outcome = Outcome("timeout", error=f"wall-clock limit of {limits.wall_s:g} s (worker killed)")
            else:
                outcome = Outcome("error", error=f"sandbox worker died (exit {worker.proc.returncode})")
            outcome.run_s = run_s
            return self._count(outcome)
        return self._count(_outcome(answer, limits, run_s))

    async def close(self) -> None:
        """Kill every worker and every process of their actions; wait until they are gone."""
        self._closed = True
        self._target = 0
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(SandboxError("the sandbox is closed"))
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

    # -- pool bookkeeping --

    def _count(self, outcome: Outcome) -> Outcome:
        self.counts[outcome.status] += 1
        cause = outcome.result.get("cause")
        if outcome.status == "killed" and cause:
            self.counts[f"killed_{cause}"] += 1
        self.counts["leftover_processes"] += outcome.result.get("leftover_processes", 0)
        return outcome

    async def _acquire(self) -> _Worker:
        while self._idle:
            worker = self._idle.pop()
            if not worker.dead:
                return worker
        if self._closed or (not self._workers and not self._starting):
            raise SandboxError(f"no sandbox worker to run on ({self.units} units, target {self._target})")
        fut: asyncio.Future[_Worker] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release(fut.result())  # handed over just as we were cancelled
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)

    def _release(self, worker: _Worker) -> None:
        if worker.dead or worker.retiring or worker not in self._workers:
            return  # the watcher replaces or forgets it
        if self.units > self._target:
            self._background(self._retire(worker))
            return
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(worker)
                return
        self._idle.append(worker)

    def _background(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    def _fail_waiters_if_empty(self, reason: str) -> None:
        if not self._workers and not self._starting:
            for fut in self._waiters:
                if not fut.done():
                    fut.set_exception(SandboxError(reason))

    async def _spawn(self, replacing: bool = False) -> None:
        self._starting += 1
        try:
            worker = await self._start_worker()
        except BaseException:  # cancelled too: the count and the waiters are put right, then it propagates
            self.counts["worker_start_failed"] += 1
            self._starting -= 1
            self._fail_waiters_if_empty("sandbox workers fail to start")
            raise
        self._starting -= 1
        self._workers.add(worker)
        self.counts["worker_started"] += 1
        if replacing:
            self.counts["worker_replaced"] += 1
        self._background(self._watch(worker))
        self._release(worker)

    async def _start_worker(self) -> _Worker:
        uid, lock = claim_uid() if self._root else (None, None)
        base = None
        if self.mode == "rlimit":
            base = tempfile.mkdtemp(prefix="swarmrl-sandbox-")
            os.chmod(base, 0o711)  # the dropped uid must reach its job dir inside
        config: dict[str, Any] = {"uid": uid, "base": base or "/tmp", "preload": list(self.preload)}
        config["guard"] = self.mode == "rlimit"
        config["guard_net"] = self.mode == "rlimit" and "--net" not in self._prefix
        # rlimit mode, root, own mount namespace: the zygote hides dirs the dropped uid cannot
        # traverse (e.g. /root holding a pyenv) under a tmpfs with the interpreter bound back.
        mount_ns = self.mode == "rlimit" and self._root and "--mount-proc" in self._prefix
        config["rebind"] = rebinds(self.python, tmp=False) if mount_ns else {}
        argv = [*self._prefix, self.python, "-m", _WORKER_MODULE, json.dumps(config)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=worker_env(),
                cwd=base or "/",
                start_new_session=True,
                limit=16 << 20,
            )
        except BaseException:  # cancelled too: its uid lock and base dir are freed, then it propagates
            if lock is not None:
                os.close(lock)
            if base:
                rmtree(base)
            raise
        worker = _Worker(proc, uid, lock, base)
        worker.reap_tree = self.mode == "rlimit" and "--pid" not in self._prefix
        try:
            await self._wait_ready(worker)
        except BaseException:  # cancelled too: the half-started worker is killed, then it propagates
            worker.kill()
            await proc.wait()
            self._cleanup(worker)
            raise
        return worker

    async def _wait_ready(self, worker: _Worker) -> None:
        proc = worker.proc
        assert proc.stdout is not None and proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
            worker.info = json.loads(line) if line else {}
        except (TimeoutError, ValueError):
            worker.info = {}
        if worker.info.get("ready") is not True:
            worker.kill()
            err = b""
            with contextlib.suppress(TimeoutError):
                err = await asyncio.wait_for(proc.stderr.read(4000), 5)
            raise SandboxError(
                f"sandbox worker did not start ({worker.info or 'no answer'}): {err.decode()!r}"
            )

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
        if self.mode == "rlimit" and worker.uid is not None and "--pid" not in self._prefix:
            self.counts["leftover_processes"] += kill_uid(worker.uid)
            worker.uid = None
        if worker.base:
            rmtree(worker.base)
            worker.base = None
        if worker.lock is not None:
            os.close(worker.lock)  # only now: its uid's leftovers are gone
            worker.lock = None


def _outcome(answer: dict[str, Any], limits: SandboxLimits, run_s: float) -> Outcome:
    result = {k: answer.get(k) for k in ("stdout", "stderr", "exit_code", "signal", "cpu_s", "truncated")}
    result["leftover_processes"] = answer.get("leftovers", 0)
    cause = answer.get("cause")
    result["cause"] = cause
    messages = {
        "timeout": f"wall-clock limit of {limits.wall_s:g} s",
        "cpu": f"CPU time limit of {math.ceil(limits.cpu_s)} s",
        "memory": f"memory limit of {limits.mem_mb} MB",
        "nproc": f"process limit of {limits.nproc} processes",
    }
    if cause == "timeout":
        return Outcome("timeout", result, messages["timeout"], run_s)
    if cause in messages:
        return Outcome("killed", result, f"killed: {messages[cause]}", run_s)
    if cause == "signal":
        return Outcome("killed", result, f"killed by {answer.get('signal')}", run_s)
    if cause == "setup":
        return Outcome("error", result, f"sandbox setup failed: {answer.get('detail')}", run_s)
    return Outcome("ok", result, "", run_s)
