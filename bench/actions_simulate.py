"""Discrete-event simulator: the real `Scheduler` driven through a trace in virtual time (pure).

Consumes a trace (`trace.make_trace`) and a policy; returns a `SimResult`. Steps run as waves: step
k starts when every trajectory of step k-1 has ended. A trajectory thinks, submits its action,
waits for it to run (every part of it), thinks, ..., then thinks once more and ends (`end_trajectory`). Nothing here
sleeps: events (think done, action done, scheduler wake-up from `next_event`) come off a heap in
time order, and `dispatch` is called once per instant, after every event at that instant.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from actions_trace import TrajectorySpec

from swarmrl.services.actions.model import RESOURCES, Action, Demand
from swarmrl.services.actions.scheduler import PoolSpec, Scheduler

THINK_DONE, RUN_DONE, WAKE = 0, 1, 2


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
    wall_s: float
    """Real seconds the simulation took."""

    @property
    def makespan_s(self) -> float:
        return sum(self.step_makespan_s)

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
) -> SimResult:
    """Run `trace` under `policy` (a name in `POLICIES`) with these pools; see the module docstring."""
    wall = time.perf_counter()
    sched = Scheduler(
        policy, pools, mem_budget_mb=mem_budget_mb, aging_s=aging_s, static_bundle=static_bundle
    )
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
                    sched.submit(
                        Action(action_id, turn.kind, turn.demand, tr_.id, t, turn.hint_s, len(turn.parts)), t
                    )
                else:
                    sched.end_trajectory(tr_.id, t)
                    left -= 1
            elif kind == RUN_DONE:
                assert tr_ is not None and action is not None
                if sched.finish(action.id, t, part_run_s):
                    del submitted[action.id], next_part[action.id]
                    act_s.append(t - action.submitted)
                    think_done_at(tr_, i + 1)
            if events and events[0][0] <= t:
                continue  # more happens at this instant: dispatch once, after all of it
            for started in sched.dispatch(t):  # one entry per part
                tr_, i = submitted[started.id]
                part = next_part.get(started.id, 0)
                next_part[started.id] = part + 1
                if part == 0:
                    wait_s.append(t - started.submitted)
                run_s = tr_.turns[i].parts[part]
                heapq.heappush(events, (t + run_s, next(seq), RUN_DONE, tr_, i, started, run_s))
            wake = sched.next_event(t)
            if wake is not None and wake != last_wake:
                heapq.heappush(events, (wake, next(seq), WAKE, None, 0, None, 0.0))
                last_wake = wake
        makespans.append(t - begin)

    stats = sched.stats(t)
    return SimResult(
        policy=policy,
        act_s=act_s,
        wait_s=wait_s,
        allocated_unit_s={r: stats[f"{r}_allocated_unit_s"] for r in RESOURCES},
        busy_unit_s={r: stats[f"{r}_busy_unit_s"] for r in RESOURCES},
        peak_units={r: int(stats[f"{r}_peak_units"]) for r in RESOURCES},
        step_makespan_s=makespans,
        wall_s=time.perf_counter() - wall,
    )
