"""The actions service: agents' action requests in (`swarm.act.<owner>`), scheduled on unit pools, run
by workers, results back to the asker and recorded (`swarm.metrics.action`, the ledger's `actions`).

    request ──► validate ──► Scheduler.submit ──► dispatch (units reserved) ──► ACTIONS work queue
       ▲                                                                           │ worker pulls
       └──── reply ◄── record ◄── Scheduler.finish ◄── swarm.actions.done.<id> ◄───┘ runs, publishes

A python action with `cases` (a test suite) is released one work message per case (`code` then the
case's code); its answer has every case's result in order. Bad input is answered `rejected` and
dead-lettered; a retried request (same episode and action id) gets the first run's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgpack
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from swarmrl.schemas import ActionRequest, ActionResult, WireError, decode, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.actions.config import KIND_RESOURCE, ActionsConfig
from swarmrl.services.actions.model import Action, Demand, Outcome
from swarmrl.services.actions.scheduler import PoolSpec, Scheduler
from swarmrl.services.actions.workers import WorkerLoop
from swarmrl.services.common import bus
from swarmrl.services.common.tasks import Background, on_signals, wait_set

log = logging.getLogger("swarmrl.actions")

REMOTE_FORGET_S = 3.0
"""A remote worker is forgotten after this many of its heartbeat periods without one."""
MAX_CASES = 256
"""Most cases (parts) of one python test-suite action."""
NEVER_RAN = "the episode ended before it ran"


def demand_of(req: ActionRequest) -> Demand:
    """The units an action holds: CPU units for python, accelerator slots (at least one) for a judge."""
    if KIND_RESOURCE[req.kind] == "accel":
        return Demand(cpu=0, mem_mb=req.mem_mb, accel=max(req.accel, 1))
    return Demand(cpu=max(req.cpu, 1), mem_mb=req.mem_mb, accel=0)


def cases_of(req: ActionRequest) -> list[str] | None:
    """The test cases of a python suite action (1 to MAX_CASES strings); None if it has none."""
    cases = req.payload.get("cases") if req.kind == "python" else None
    valid = (
        isinstance(cases, list) and 1 <= len(cases) <= MAX_CASES and all(isinstance(c, str) for c in cases)
    )
    if cases is not None and not valid:
        raise WireError("schema", f"python payload 'cases' must be a list of 1 to {MAX_CASES} code strings")
    return cases


def _ids(data: bytes) -> dict[str, str]:
    """The string ids of a rejected request, "?" where it has none."""
    raw: Any = None
    with contextlib.suppress(Exception):
        raw = msgpack.unpackb(data, raw=False)
    raw = raw if isinstance(raw, dict) else {}
    return {
        k: v[:128] if isinstance(v := raw.get(k), str) else "?" for k in ("action_id", "episode_id", "kind")
    }


@dataclass
class Pending:
    """One accepted request, from arrival to its result."""

    req: ActionRequest
    owner: str
    arrived: float
    future: asyncio.Future[ActionResult]
    cases: list[str] | None = None
    """A python test suite's cases (its parts); None: one part, the request itself."""
    started: float = 0.0
    """When its first part was released (0: still waiting)."""
    units: int = 0
    released: int = 0
    done: dict[int, Outcome] = field(default_factory=dict)


@dataclass
class Remote:
    kind: str
    units: int
    seen: float
    period_s: float


@dataclass
class Counts:
    by_status: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)


class ActionsService:
    def __init__(self, cfg: ActionsConfig, nc: NATS, js: JetStreamContext) -> None:
        self.cfg, self.nc, self.js = cfg, nc, js
        accel_ceiling = cfg.accel_ceiling if cfg.judge_engine else 0
        pools = {
            "cpu": PoolSpec(cfg.cpu_floor, cfg.cpu_ceiling, cfg.idle_s),
            "accel": PoolSpec(cfg.accel_floor, accel_ceiling, cfg.idle_s),
        }
        self.scheduler = Scheduler(cfg.policy, pools, mem_budget_mb=cfg.mem_budget_mb, aging_s=cfg.aging_s)
        self.dead_letters = bus.DeadLetters(nc, "actions")
        self.pending: dict[str, Pending] = {}  # by "<episode>.<action>"
        self.inflight: dict[str, tuple[str, int, float]] = {}  # dispatch id -> pending key, part, deadline
        self.recent: OrderedDict[str, ActionResult] = OrderedDict()  # answered, for retries
        self.last_action: dict[str, float] = {}  # trajectory -> time of its last action
        self.remotes: dict[str, Remote] = {}
        self.workers: dict[str, WorkerLoop] = {}
        self.counts = Counts()
        self._answering = Background()
        self._recording = Background()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        if self.cfg.local_workers:
            for kind, resource in KIND_RESOURCE.items():
                if kind == "judge" and not self.cfg.judge_engine:
                    continue
                units = self.scheduler.pool_size(resource)
                loop = WorkerLoop(self.js, self.nc, kind, self.cfg, units, f"local-{kind}")
                await loop.start()
                self.workers[kind] = loop
        subs = [
            await self.nc.subscribe(S.ACT_REQUESTS, queue="actions", cb=self._on_request),
            await self.nc.subscribe(f"{S.ACTION_DONE_PREFIX}.*", cb=self._on_done),
            await self.nc.subscribe(S.ACTION_WORKERS_SUBJECT, cb=self._on_worker),
        ]
        log.info(
            "actions: policy=%s cpu=%d..%d accel=%d..%d local_workers=%s",
            self.cfg.policy, self.cfg.cpu_floor, self.cfg.cpu_ceiling, self.cfg.accel_floor,
            self.cfg.accel_ceiling, sorted(self.workers),
        )  # fmt: skip
        try:
            await self._schedule_loop()
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            for loop in self.workers.values():
                await loop.close()
            # Actions in flight are not answered: their askers repeat the request (same id) until
            # a service answers, so the next service (a restart) runs them.
            self._answering.cancel()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def _on_request(self, msg: Msg) -> None:
        owner = msg.subject.rsplit(".", 1)[-1]
        try:
            req = self._parse(msg, owner)
        except WireError as exc:
            self.counts.rejected[exc.code] += 1
            await self.dead_letters.send(msg, str(exc))
            answer = {"status": "rejected", "error": str(exc), "policy": self.cfg.policy, "owner": owner}
            await self._reply(msg, ActionResult.model_validate(_ids(msg.data) | answer))
            return
        if req.op == "end":
            self._end_trajectory(req.episode_id, time.monotonic())
            return
        key = f"{req.episode_id}.{req.action_id}"
        if (done := self.recent.get(key)) is not None:
            await self._reply(msg, done)
            return
        pending = self.pending.get(key) or self._submit(req, owner, key)
        # Answer from a task: nats-py runs a subscription's callbacks one at a time, and this one
        # would otherwise hold every later request until this action is done.
        self._answering.spawn(self._answer(msg, pending))

    async def _answer(self, msg: Msg, pending: Pending) -> None:
        await self._reply(msg, await asyncio.shield(pending.future))

    def _parse(self, msg: Msg, owner: str) -> ActionRequest:
        if len(msg.data) > self.cfg.max_payload_bytes:
            raise WireError("oversized", f"action of {len(msg.data)} bytes > {self.cfg.max_payload_bytes}")
        req = decode(msg.data, ActionRequest)
        if S.episode_owner(req.episode_id) != owner:
            raise WireError("not_owner", f"client {owner!r} may not act in episode {req.episode_id!r}")
        if req.op == "end":
            return req
        resource = KIND_RESOURCE.get(req.kind)
        if resource is None:
            raise WireError("unknown_kind", f"action kind {req.kind!r}; known: {sorted(KIND_RESOURCE)}")
        if resource == "accel" and not self.cfg.judge_engine:
            raise WireError(
                "unknown_kind", "no judge in this swarm (the actions service has no --judge-engine)"
            )
        cases_of(req)
        try:
            self.scheduler.check_fits(demand_of(req), f"action {req.action_id!r}")
        except ValueError as exc:
            raise WireError("demand", str(exc)) from exc
        return req

    def _submit(self, req: ActionRequest, owner: str, key: str) -> Pending:
        now = time.monotonic()
        cases = cases_of(req)
        pending = Pending(req, owner, now, asyncio.get_running_loop().create_future(), cases)
        self.pending[key] = pending
        self.last_action[req.episode_id] = now
        parts = len(cases) if cases else 1
        self.scheduler.submit(
            Action(key, req.kind, demand_of(req), req.episode_id, now, req.hint_s, parts), now
        )
        self._wake.set()
        return pending

    async def _reply(self, msg: Msg, result: ActionResult) -> None:
        if msg.reply:
            with contextlib.suppress(Exception):  # the asker is gone
                await msg.respond(encode(result))

    async def _schedule_loop(self) -> None:
        while not self._stop.is_set():
            # Cleared before the work: a wake-up set while this pass awaits is kept.
            self._wake.clear()
            now = time.monotonic()
            self._expire(now)
            for action in self.scheduler.dispatch(now):
                await self._release(action, now)
            for kind, loop in self.workers.items():
                await loop.set_units(
                    max(self.scheduler.pool_size(KIND_RESOURCE[kind]) - self._remote_units(kind), 0)
                )
            nxt = self.scheduler.next_event(now)
            wait = 1.0 if nxt is None else min(max(nxt - now, 0.0), 1.0)
            await wait_set(self._wake, wait)

    async def _release(self, action: Action, now: float) -> None:
        """Queue the next part of `action` for the workers (the scheduler has its units)."""
        pending = self.pending[action.id]
        part = pending.released
        pending.released += 1
        dispatch_id = uuid.uuid4().hex
        if not part:
            pending.started = now
        pending.units = self.scheduler.pool_size(KIND_RESOURCE[action.kind])
        wall = min(pending.req.timeout_s or self.cfg.wall_s, self.cfg.max_wall_s)
        # After the deadline, a worker that died mid-run has had its redeliveries.
        self.inflight[dispatch_id] = (action.id, part, now + wall + 60.0)
        update: dict[str, Any] = {"action_id": dispatch_id}
        if pending.cases is not None:
            payload = {k: v for k, v in pending.req.payload.items() if k != "cases"}
            payload["code"] = f"{payload.get('code', '')}\n{pending.cases[part]}"
            update["payload"] = payload
        work = pending.req.model_copy(update=update)
        try:
            headers = {"Nats-Msg-Id": dispatch_id}
            await self.js.publish(S.action_run_subject(action.kind), encode(work), headers=headers)
        except Exception as exc:
            self._part_done(dispatch_id, Outcome("error", error=f"could not queue the action: {exc}"))

    async def _on_done(self, msg: Msg) -> None:
        try:
            done = decode(msg.data, ActionResult)
        except WireError as exc:
            await self.dead_letters.send(msg, str(exc))
            return
        # Unknown: a second run of a redelivered part, or one that already timed out.
        if done.action_id in self.inflight:
            self._part_done(done.action_id, Outcome(done.status, done.result, done.error, done.run_s))

    def _part_done(self, dispatch_id: str, outcome: Outcome) -> None:
        """A released part ended; the action is answered when its last part has."""
        key, part, _ = self.inflight.pop(dispatch_id)
        pending = self.pending[key]
        pending.done[part] = outcome
        now = time.monotonic()
        if pending.req.episode_id in self.last_action:  # a long suite is not a silent trajectory
            self.last_action[pending.req.episode_id] = now
        if not self.scheduler.finish(key, now, outcome.run_s, ok=outcome.status == "ok"):
            self._wake.set()
            return
        if pending.cases is None:
            self._finish(key, outcome)
            return
        parts = [pending.done.get(i, Outcome("error", error=NEVER_RAN)) for i in range(len(pending.cases))]
        failed = [p for p in parts if p.status != "ok"]
        cases = [{"status": p.status, "error": p.error, "run_s": p.run_s, **p.result} for p in parts]
        passed = sum(p.status == "ok" and p.result.get("exit_code") == 0 for p in parts)
        self._finish(key, Outcome(
            failed[0].status if failed else "ok", {"cases": cases, "passed": passed},
            f"{len(failed)} of {len(parts)} cases: {failed[0].error}" if failed else "",
            sum(p.run_s for p in parts),
        ))  # fmt: skip

    def _expire(self, now: float) -> None:
        for dispatch_id, (_, _, deadline) in list(self.inflight.items()):
            if now > deadline:
                self._part_done(
                    dispatch_id, Outcome("error", error="no worker reported a result (workers died?)")
                )
        silent = [t for t, last in self.last_action.items() if now - last > self.cfg.trajectory_timeout_s]
        if silent:
            busy = {p.req.episode_id for p in self.pending.values()}
            for trajectory in silent:
                if trajectory not in busy:
                    self._end_trajectory(trajectory, now)
        for name, remote in list(self.remotes.items()):
            if now - remote.seen > REMOTE_FORGET_S * remote.period_s:
                log.warning("remote worker %s (%d %s units) is gone", name, remote.units, remote.kind)
                del self.remotes[name]
                self._wake.set()  # the loop gives the local workers the units the remote one had

    def _end_trajectory(self, trajectory: str, now: float) -> None:
        """The episode is over: `static` frees its units; its actions still waiting are answered."""
        self.last_action.pop(trajectory, None)
        for action in self.scheduler.end_trajectory(trajectory, now):
            self._finish(action.id, Outcome("error", error=NEVER_RAN))
        self._wake.set()

    def _finish(self, key: str, outcome: Outcome) -> None:
        """Answer the action (the scheduler is done with it: finished, or dropped before it ran)."""
        p = self.pending.pop(key)
        now = time.monotonic()
        result = ActionResult(
            action_id=p.req.action_id, episode_id=p.req.episode_id, kind=p.req.kind, status=outcome.status,
            result=outcome.result, error=outcome.error, queued_s=(p.started or now) - p.arrived,
            run_s=outcome.run_s, act_s=now - p.arrived, cpu=p.req.cpu, mem_mb=p.req.mem_mb,
            accel=p.req.accel, units=p.units, policy=self.cfg.policy, owner=p.owner,
        )  # fmt: skip
        self.counts.by_status[result.status] += 1
        self.recent[key] = result
        while len(self.recent) > 10_000:
            self.recent.popitem(last=False)
        p.future.set_result(result)
        if self.cfg.record:
            self._recording.spawn(self._record(result))
        self._wake.set()

    async def _record(self, result: ActionResult) -> None:
        msg_id = f"action.{result.episode_id}.{result.action_id}"
        try:
            await self.js.publish(S.ACTION_METRICS_SUBJECT, encode(result), headers={"Nats-Msg-Id": msg_id})
        except Exception as exc:  # the agent has its result; only the ledger row is missing
            log.warning("could not record action %s: %s", msg_id, exc)

    async def _on_worker(self, msg: Msg) -> None:
        try:
            beat = msgpack.unpackb(msg.data, raw=False)
            name, kind, units = str(beat["name"]), str(beat["kind"]), int(beat["units"])
            period = float(beat.get("period_s", 2.0))
        except Exception as exc:
            await self.dead_letters.send(msg, f"malformed: worker heartbeat: {exc}")
            return
        if kind not in KIND_RESOURCE or units < 0:
            await self.dead_letters.send(msg, f"schema: worker heartbeat kind={kind!r} units={units}")
            return
        known = self.remotes.get(name)
        self.remotes[name] = Remote(kind, units, time.monotonic(), period)
        if known is None or known.units != units:
            log.info("remote worker %s: %d %s units", name, units, kind)
            self._wake.set()

    def _remote_units(self, kind: str) -> int:
        """The pools' ceilings count every unit: remote ones are taken off the local workers."""
        return sum(r.units for r in self.remotes.values() if r.kind == kind)


async def run(cfg: ActionsConfig) -> None:
    """`swarmrl serve actions`: the service on its own connection, until SIGTERM or SIGINT."""
    nc = await bus.connect(cfg.nats, "actions")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    service = ActionsService(cfg, nc, js)
    on_signals(service.request_stop)
    try:
        await service.run()
    finally:
        await bus.close(nc)
