"""Discrete-event simulator: the real `Scheduler` driven through a trace in virtual time (pure).
The scheduler's tests run it (`tests/unit/actions`), and `bench/actions.py` at scale.

Consumes a trace (`trace.make_trace`) and a policy; returns a `SimResult`. Steps run as waves: step
k starts when every trajectory of step k-1 has ended. A trajectory thinks, submits its action,
waits for it to run (every part of it), thinks, ..., then thinks once more and ends (`end_trajectory`). Nothing here
sleeps: events (think done, action done, scheduler wake-up from `next_event`) come off a heap in
time order, and `dispatch` is called once per instant, after every event at that instant.

`isolated` (per-task isolated pools, the other common practice) is no policy of the scheduler: it
is one `fifo` scheduler per task kind of the trace (`TrajectorySpec.task`), each on its own pools
(`task_pools`, e.g. from `split_pools`); a trajectory's actions only ever use its task's pools.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarmrl.services.actions.model import RESOURCES, Action, Demand
from swarmrl.services.actions.scheduler import PoolSpec, Scheduler
from tests.support.actions_trace import TrajectorySpec

THINK_DONE, RUN_DONE, WAKE = 0, 1, 2
CPU_START_S = 0.05
"""Warm-up of a new CPU unit (elastic) or bundle (static): a sandbox worker's start."""


@dataclass
class SimResult:
    """What one simulated run measured; unit-seconds are counted over the whole run."""

    policy: str
    act_s: list[float]
    """Action completion time (queued + run) of every action, in the order they finished."""
    wait_s: list[float]
    """Time queued of every action, in the order they started."""
    allocated_unit_s: dict[str, float]
    busy_unit_s: dict[str, float]
    peak_units: dict[str, int]
    step_makespan_s: list[float]
    """Rollout-step time of every step: from its wave's start until its last trajectory ends."""
    wall_s: float
    """Real seconds the simulation took."""
    task_peak_units: dict[str, dict[str, int]] = field(default_factory=dict)
    """`isolated`: the peak units of each task's own pools."""

    @property
    def makespan_s(self) -> float:
        return sum(self.step_makespan_s)

    @property
    def mean_step_s(self) -> float:
        return self.makespan_s / len(self.step_makespan_s) if self.step_makespan_s else 0.0

    @property
    def mean_act_s(self) -> float:
        return sum(self.act_s) / len(self.act_s) if self.act_s else 0.0

    @property
    def p50_act_s(self) -> float:
        return percentile(self.act_s, 0.50)

    @property
    def p99_act_s(self) -> float:
        return percentile(self.act_s, 0.99)

    @property
    def utilisation(self) -> dict[str, float]:
        return {
            r: self.busy_unit_s[r] / a if (a := self.allocated_unit_s[r]) else 0.0
            for r in self.allocated_unit_s
        }

    def summary(self) -> dict[str, Any]:
        """One flat row of the headline numbers (rounded), for tables and JSON."""
        row: dict[str, Any] = {
            "policy": self.policy,
            "actions": len(self.act_s),
            "mean_act_s": round(self.mean_act_s, 4),
            "p50_act_s": round(self.p50_act_s, 4),
            "p99_act_s": round(self.p99_act_s, 4),
            "mean_wait_s": round(sum(self.wait_s) / len(self.wait_s), 4) if self.wait_s else 0.0,
            "makespan_s": round(self.makespan_s, 3),
            "mean_step_s": round(self.mean_step_s, 3),
            "step_makespan_s": [round(m, 3) for m in self.step_makespan_s],
        }
        for r in self.allocated_unit_s:
            row[f"{r}_unit_s"] = round(self.allocated_unit_s[r], 1)
            row[f"{r}_busy_unit_s"] = round(self.busy_unit_s[r], 1)
            row[f"{r}_utilisation"] = round(self.utilisation[r], 4)
            row[f"{r}_peak_units"] = self.peak_units[r]
        row["wall_s"] = round(self.wall_s, 3)
        return row


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in [0, 1]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]


def simulate(
    trace: list[TrajectorySpec],
    policy: str,
    pools: dict[str, PoolSpec],
    *,
    mem_budget_mb: int,
    aging_s: float = 30.0,
    static_bundle: Demand | None = None,
    task_pools: dict[str, dict[str, PoolSpec]] | None = None,
) -> SimResult:
    """Run `trace` under `policy` (a name in `POLICIES`, or `isolated` with `task_pools`, one entry
    per task kind of the trace; `pools` is then unused) with these pools; see the module docstring."""
    wall = time.perf_counter()
    if policy == "isolated":
        if task_pools is None or {tr.task for tr in trace} - set(task_pools):
            raise ValueError(
                f"isolated needs task_pools for every task of the trace {sorted({tr.task for tr in trace})}, "
                f"got {sorted(task_pools or {})}"
            )
        scheds = {
            task: Scheduler("fifo", tp, mem_budget_mb=mem_budget_mb, aging_s=aging_s)
            for task, tp in task_pools.items()
        }
    else:
        scheds = {
            "": Scheduler(
                policy, pools, mem_budget_mb=mem_budget_mb, aging_s=aging_s, static_bundle=static_bundle
            )
        }
    by_task = policy == "isolated"

    def sched_of(tr: TrajectorySpec) -> Scheduler:
        return scheds[tr.task if by_task else ""]

    by_step: dict[int, list[TrajectorySpec]] = defaultdict(list)
    for tr in trace:
        by_step[tr.step].append(tr)

    # (time, tie-break, event kind, trajectory, turn index, action, part run time): what happens next.
    events: list[tuple[float, int, int, TrajectorySpec | None, int, Action | None, float]] = []
    seq = itertools.count()
    act_s: list[float] = []
    wait_s: list[float] = []
    makespans: list[float] = []
    submitted: dict[str, tuple[TrajectorySpec, int]] = {}
    next_part: dict[str, int] = {}
    first_submit: dict[str, float] = {}
    t = 0.0
    last_wake: float | None = None

    def think_done_at(tr: TrajectorySpec, i: int) -> None:
        """Turn `i` of `tr` (or its end, past the last turn) happens after its think time."""
        think = tr.turns[i].think_s if i < len(tr.turns) else tr.final_think_s
        heapq.heappush(events, (t + think, next(seq), THINK_DONE, tr, i, None, 0.0))

    for step in sorted(by_step):
        begin = t
        left = len(by_step[step])
        for tr in by_step[step]:
            think_done_at(tr, 0)
        while left:
            if not events:
                raise RuntimeError(
                    f"simulation stalled at t={t:.3f}: {left} trajectories of step {step} wait forever"
                )
            t, _, kind, tr_, i, action, part_run_s = heapq.heappop(events)
            if kind == THINK_DONE:
                assert tr_ is not None
                if i < len(tr_.turns):
                    turn, action_id = tr_.turns[i], f"{tr_.id}/{i}"
                    submitted[action_id] = (tr_, i)
                    first_submit.setdefault(tr_.task, t)
                    sched_of(tr_).submit(
                        Action(action_id, turn.kind, turn.demand, tr_.id, t, turn.hint_s, len(turn.parts)), t
                    )
                else:
                    sched_of(tr_).end_trajectory(tr_.id, t)
                    left -= 1
            elif kind == RUN_DONE:
                assert tr_ is not None and action is not None
                if sched_of(tr_).finish(action.id, t, part_run_s):
                    del submitted[action.id], next_part[action.id]
                    act_s.append(t - action.submitted)
                    think_done_at(tr_, i + 1)
            if events and events[0][0] <= t:
                continue  # more happens at this instant: dispatch once, after all of it
            for sched in scheds.values():
                for started in sched.dispatch(t):  # one entry per part
                    tr_, i = submitted[started.id]
                    part = next_part.get(started.id, 0)
                    next_part[started.id] = part + 1
                    if part == 0:
                        wait_s.append(t - started.submitted)
                    run_s = tr_.turns[i].parts[part]
                    heapq.heappush(events, (t + run_s, next(seq), RUN_DONE, tr_, i, started, run_s))
            wake = min((w for sc in scheds.values() if (w := sc.next_event(t)) is not None), default=None)
            if wake is not None and wake != last_wake:
                heapq.heappush(events, (wake, next(seq), WAKE, None, 0, None, 0.0))
                last_wake = wake
        makespans.append(t - begin)

    stats = {task: sc.stats(t) for task, sc in scheds.items()}
    if by_task and first_submit:
        # fifo allocates its pools at its own first submit; isolated pools are all provisioned when
        # the run's first action arrives, so each pool also costs its ceiling until its task's first.
        began = min(first_submit.values())
        for task, st in stats.items():
            for r, spec in scheds[task].pools.items():
                st[f"{r}_allocated_unit_s"] += spec.ceiling * (first_submit.get(task, t) - began)

    def total(key: str) -> float:
        return sum(st[key] for st in stats.values())

    return SimResult(
        policy=policy,
        act_s=act_s,
        wait_s=wait_s,
        allocated_unit_s={r: total(f"{r}_allocated_unit_s") for r in RESOURCES},
        busy_unit_s={r: total(f"{r}_busy_unit_s") for r in RESOURCES},
        # Isolated pools are fixed (fifo allocates its ceiling): their peaks are simultaneous.
        peak_units={r: int(total(f"{r}_peak_units")) for r in RESOURCES},
        step_makespan_s=makespans,
        wall_s=time.perf_counter() - wall,
        task_peak_units={
            task: {r: int(st[f"{r}_peak_units"]) for r in RESOURCES} for task, st in stats.items()
        }
        if by_task
        else {},
    )


def split_units(trace: list[TrajectorySpec], resource: str, units: int) -> dict[str, int]:
    """`units` of `resource` split between the trace's task kinds in proportion to each kind's
    demand (run seconds x units over the whole trace: a provisioner that knows the mix), each kind
    getting at least its largest single action (so every action can run); largest remainder."""
    demand: dict[str, float] = defaultdict(float)
    need: dict[str, int] = defaultdict(int)
    for tr in trace:
        demand[tr.task] += 0.0
        for turn in tr.turns:
            demand[tr.task] += turn.run_s * turn.demand.units(resource)
            need[tr.task] = max(need[tr.task], turn.demand.units(resource))
    if sum(need.values()) > units:
        raise ValueError(f"{units} {resource} units cannot hold one action of each task: {dict(need)}")
    whole = sum(demand.values())
    exact = {k: units * d / whole if whole else 0.0 for k, d in demand.items()}
    share = {k: max(need[k], math.floor(x)) for k, x in exact.items()}
    by_remainder = sorted(exact, key=lambda k: (share[k] - exact[k], k))
    while sum(share.values()) < units:
        k = by_remainder.pop(0) if by_remainder else max(exact, key=lambda k: exact[k])
        share[k] += 1
    while sum(share.values()) > units:  # the minimums took more than their share: from the largest
        k = max((k for k in share if share[k] > need[k]), key=lambda k: (share[k] - exact[k], k))
        share[k] -= 1
    return share


def split_pools(trace: list[TrajectorySpec], pools: dict[str, PoolSpec]) -> dict[str, dict[str, PoolSpec]]:
    """Fixed per-task pools (`floor == ceiling`, as `fifo` holds them) splitting `pools`' ceilings."""
    shares = {r: split_units(trace, r, spec.ceiling) for r, spec in pools.items()}
    tasks = sorted({tr.task for tr in trace})
    return {
        task: {
            r: PoolSpec(shares[r][task], shares[r][task], idle_s=spec.idle_s, start_s=spec.start_s)
            for r, spec in pools.items()
        }
        for task in tasks
    }


def smallest_reaching(
    mean_act_at: Callable[[float], float],
    target_s: float,
    factors: Sequence[float],
    *,
    flat: int = 3,
    flat_rel: float = 0.005,
) -> tuple[float | None, dict[float, float]]:
    """The smallest of `factors` (ascending) at which `mean_act_at(factor) <= target_s`, or None if
    none does, and the mean ACT of every factor tried. Scans upward and stops at the first that
    reaches (mean ACT need not be monotone in the pool size: what is reported is the first size
    that reaches, never a guess between sizes), or gives up once `flat` sizes in a row improved the
    best mean ACT by less than `flat_rel` (the policy's floor: more units no longer help)."""
    if list(factors) != sorted(factors):
        raise ValueError(f"factors must be ascending, got {list(factors)}")
    tried: dict[float, float] = {}
    best, since_better = math.inf, 0
    for f in factors:
        tried[f] = act = mean_act_at(f)
        if act <= target_s:
            return f, tried
        if act < best * (1 - flat_rel):
            since_better = 0
        else:
            since_better += 1
            if since_better >= flat:
                break
        best = min(best, act)
    return None, tried


def floor_reached_at(tried: dict[float, float], rel: float) -> float:
    """The smallest factor whose mean ACT is within `rel` of the best of `tried`: where more units
    stop helping."""
    best = min(tried.values())
    return min(f for f, a in tried.items() if a <= best * (1 + rel))


def pools_for(policy: str, units: int, slots: int, trajectories: int, idle_s: float) -> dict[str, PoolSpec]:
    """The pools of `policy` (`isolated`: the whole, which `split_pools` cuts per task)."""
    if policy == "static-unbounded":
        return {"cpu": PoolSpec(0, trajectories), "accel": PoolSpec(0, trajectories)}
    if policy == "static":
        return {"cpu": PoolSpec(0, units, start_s=CPU_START_S), "accel": PoolSpec(0, slots)}
    floor_cpu, floor_accel = (1, 1) if policy == "elastic" else (units, slots)
    return {
        "cpu": PoolSpec(floor_cpu, units, idle_s=idle_s, start_s=CPU_START_S),
        "accel": PoolSpec(floor_accel, slots, idle_s=idle_s, start_s=0.0),
    }
