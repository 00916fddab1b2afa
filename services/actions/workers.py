"""Action workers: pull released actions from the ACTIONS work queue, run them on a resource manager,
publish each result to `swarm.actions.done.<dispatch id>`, then ack. The same loop runs in the actions
service (its local units) and in `swarmrl serve action-worker` (remote units, on any machine).

Execution is at least once: a worker that dies mid-action leaves the message unacked, JetStream
hands it to another worker after `ACK_WAIT_S`, and the service keeps the first result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from typing import Any

import msgpack
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from swarmrl.schemas import ActionRequest, ActionResult, WireError, decode, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.actions.config import WorkerConfig, WorkerLimits
from swarmrl.services.actions.model import Outcome
from swarmrl.services.common import bus
from swarmrl.services.common.tasks import Background, on_signals, wait_set

log = logging.getLogger("swarmrl.actions")

ACK_WAIT_S = 30.0
"""A worker keeps its running actions alive with in-progress acks every third of this."""
MAX_DELIVER = 3
"""A released action is handed out at most this often (a worker died running it each time)."""


def build_manager(kind: str, limits: WorkerLimits) -> Any:
    """The resource manager for `kind` (`python` or `judge`), not started: `PythonSandbox` or
    `JudgeManager`, both with `start`, `resize`, `run` and `close`."""
    if kind == "python":
        from swarmrl.services.actions.sandbox import PythonSandbox

        return PythonSandbox(mode=limits.sandbox)
    if not limits.judge_engine:
        raise ValueError("a judge worker needs --judge-engine URL (the engine that scores text)")
    from swarmrl.services.actions.judge import JudgeManager

    return JudgeManager(limits.judge_engine, limits.judge_tokenizer)


class WorkerLoop:
    """Pulls `kind` work messages (`ActionRequest`s whose `action_id` is the dispatch id) while it has
    free units and runs them on its resource manager; `set_units` follows the scheduler's pool size."""

    def __init__(
        self, js: JetStreamContext, nc: Any, kind: str, limits: WorkerLimits, units: int, name: str
    ) -> None:
        self.js, self.nc, self.kind, self.limits, self.name = js, nc, kind, limits, name
        self.manager = build_manager(kind, limits)
        self.units = units
        self.running = Background()
        self.counts: Counter[str] = Counter()
        self._freed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.manager.start(self.units)
        self.sub = await bus.durable_pull(
            self.js, S.ACTIONS_STREAM, S.durable_name("actions", S.ACTIONS_STREAM, self.kind),
            S.action_run_subject(self.kind), ack_wait_s=ACK_WAIT_S, max_deliver=MAX_DELIVER,
        )  # fmt: skip
        self._task = asyncio.create_task(self._pull())

    async def set_units(self, units: int) -> None:
        if units != self.units:
            self.units = units
            await self.manager.resize(max(units, 0))
            self._freed.set()

    async def _pull(self) -> None:
        while True:
            free = self.units - len(self.running)
            if free <= 0:
                self._freed.clear()
                await wait_set(self._freed, 1.0)
                continue
            try:
                msgs = await self.sub.fetch(free, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                await asyncio.sleep(0.2)
                continue
            except Exception as exc:  # a 503 while a cluster elects a leader, a broker restart
                log.warning("worker %s: fetch failed (%s); retrying", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                self.running.spawn(self._run(msg)).add_done_callback(lambda _: self._freed.set())

    async def _run(self, msg: Msg) -> None:
        try:
            req = decode(msg.data, ActionRequest)
        except WireError as exc:  # only services publish here; a bad one is a bug: drop it loudly
            log.error("worker %s: undecodable work message dropped: %s", self.name, exc)
            await msg.term()
            return
        started = time.monotonic()
        keep = asyncio.create_task(_keep_alive(msg))
        try:
            outcome = await self._execute(req)
        except TimeoutError:
            outcome = Outcome("timeout", error=f"no result within {req.timeout_s or self.limits.wall_s} s")
        except Exception as exc:  # a manager bug must not take the worker down
            log.exception("worker %s: action %s failed", self.name, req.action_id)
            outcome = Outcome("error", error=f"{type(exc).__name__}: {exc}")
        finally:
            keep.cancel()
        self.counts[outcome.status] += 1
        done = ActionResult(
            action_id=req.action_id, episode_id=req.episode_id, kind=req.kind, status=outcome.status,
            result=outcome.result, error=outcome.error[:4000],
            run_s=outcome.run_s or time.monotonic() - started,
        )  # fmt: skip
        try:
            await self.nc.publish(S.action_done_subject(req.action_id), encode(done))
            await msg.ack()
        except Exception as exc:  # unacked: it runs again elsewhere; the service keeps the first result
            log.warning("worker %s: could not report action %s: %s", self.name, req.action_id, exc)

    async def _execute(self, req: ActionRequest) -> Outcome:
        if req.kind != self.kind:
            return Outcome("rejected", error=f"worker runs {self.kind!r} actions, not {req.kind!r}")
        wall = min(req.timeout_s or self.limits.wall_s, self.limits.max_wall_s)
        if self.kind == "python":
            from swarmrl.services.actions.sandbox import SandboxLimits

            limits = SandboxLimits(cpu_s=self.limits.cpu_s * max(req.cpu, 1), mem_mb=req.mem_mb, wall_s=wall)
            code, stdin = req.payload.get("code"), req.payload.get("stdin", "")
            return await self.manager.run(code, limits=limits, stdin=stdin)  # rejects non-str ones
        return await asyncio.wait_for(self.manager.run(req.payload), wall)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.running.close()
        await self.manager.close()


async def _keep_alive(msg: Msg) -> None:
    while True:
        await asyncio.sleep(ACK_WAIT_S / 3)
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def run_worker(cfg: WorkerConfig) -> None:
    """`swarmrl serve action-worker`: `cfg.units` units of `cfg.kind`, announced on
    `swarm.actions.workers` every `heartbeat_s` (0 units once it stops), until SIGTERM or SIGINT."""
    name = cfg.name or f"{socket.gethostname()}-{os.getpid()}"
    nc = await bus.connect(cfg.nats, f"action-worker-{name}")
    worker = WorkerLoop(nc.jetstream(), nc, cfg.kind, cfg, cfg.units, name)
    await worker.start()
    stop = asyncio.Event()
    on_signals(stop.set)
    beat = {"name": name, "kind": cfg.kind, "units": cfg.units, "period_s": cfg.heartbeat_s}
    try:
        while not stop.is_set():
            await nc.publish(S.ACTION_WORKERS_SUBJECT, msgpack.packb(beat))
            await wait_set(stop, cfg.heartbeat_s)
        await nc.publish(S.ACTION_WORKERS_SUBJECT, msgpack.packb(beat | {"units": 0}))  # gone now
    finally:
        await worker.close()
        await bus.close(nc)
