"""Action scheduler (pure, no NATS): which waiting action starts now, and how many units each pool holds.

Every call takes the clock as `now` (monotonic seconds in the service, virtual ones in the simulator,
`tests/support/actions_simulate.py`); a `now` earlier than one already seen is clamped. The policies
(`policies.py`, chosen by name) share what is here:

- Waiting actions queue per resource (`accel` if they ask for any, else `cpu`), so a judge call never
  waits behind a code run. Pools start empty; a new unit or `static` bundle is usable `start_s` later.
- Memory is one budget: the `mem_mb` of running actions never exceeds `mem_budget_mb`.
- An action may have several independent `parts` (a test suite's cases), each on the action's
  demand: the next part starts on the units the last one held; `elastic` may also start parts on
  spare units, which a part that ends while others run gives back. `dispatch` lists every part.

Invariants: per resource, busy <= allocated <= ceiling (elastic: allocated >= floor once started);
an action starts only when all its units and memory are free; starting units are allocated, not free.
"""

from __future__ import annotations

import math

from swarmrl.services.actions.model import RESOURCES, Action, Demand, PoolSpec, Predictor, Usage
from swarmrl.services.actions.policies import POLICIES, AnyPolicy


class Scheduler:
    """Admits actions, asks the policy which to start, and meters the units it holds."""

    def __init__(
        self,
        policy: str,
        pools: dict[str, PoolSpec],
        *,
        mem_budget_mb: int,
        aging_s: float = 30.0,
        static_bundle: Demand | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}")
        unknown = sorted(set(pools) - set(RESOURCES))
        if unknown:
            raise ValueError(f"unknown pool(s) {unknown}; resources are {list(RESOURCES)}")
        if mem_budget_mb <= 0 or aging_s < 0:
            raise ValueError(f"need mem_budget_mb > 0 and aging_s >= 0, got {mem_budget_mb} and {aging_s}")
        self.pools = {r: pools.get(r, PoolSpec(0, 0)) for r in RESOURCES}
        self.mem_budget_mb, self.aging_s, self.static_bundle = mem_budget_mb, aging_s, static_bundle
        self.t = -math.inf
        self.mem_used_mb = 0
        self.waiting: dict[str, Action] = {}
        self.running: dict[str, Action] = {}
        self.unstarted: dict[str, Action] = {}
        """Running actions with parts not started yet."""
        self.again: list[Action] = []
        """Parts that start on their action's units at the next `dispatch`."""
        self.waiting_by_trajectory: dict[str, set[str]] = {}
        self.usage = {r: Usage() for r in RESOURCES}
        self.predictor = Predictor()
        self.finished = self.failed = 0
        self.policy: AnyPolicy = POLICIES[policy](self)
        if static_bundle is not None:
            self.check_fits(static_bundle, "static_bundle")

    def submit(self, action: Action, now: float) -> None:
        """Queue `action`; raises ValueError (naming the values) if it can never run here."""
        now = self._advance(now)
        d = action.demand
        if action.parts < 1 or action.started_parts:
            raise ValueError(f"action {action.id!r}: needs parts >= 1, not started, got {action.parts}")
        if min(d.cpu, d.accel, d.mem_mb) < 0 or d.cpu + d.accel == 0:
            raise ValueError(
                f"action {action.id!r}: demand {d} must ask for a cpu or accel unit, none negative"
            )
        self.check_fits(d, f"action {action.id!r}")
        if action.id in self.waiting or action.id in self.running:
            raise ValueError(f"action {action.id!r} was already submitted")
        self.policy.check(action)
        self.waiting[action.id] = action
        self.waiting_by_trajectory.setdefault(action.trajectory, set()).add(action.id)
        self.policy.submit(action, now)

    def dispatch(self, now: float) -> list[Action]:
        """The parts to start now, one entry per part; their units and memory are taken."""
        now = self._advance(now)
        out, self.again = self.again, []
        return out + self.policy.dispatch(now)

    def finish(self, action_id: str, now: float, run_s: float, ok: bool = True) -> bool:
        """A part of `action_id` ended; True if that was the action's last. Its next part, if no
        other part runs, starts on the same units at the next `dispatch`. An action whose parts all
        ran ok teaches the predictor (a failed one may have stopped early)."""
        now = self._advance(now)
        action = self.running.get(action_id)
        if action is None or action.running_parts < 1:
            raise ValueError(f"finish: action {action_id!r} is not running")
        action.running_parts -= 1
        action.run_s += run_s
        action.failed = action.failed or not ok
        if action.parts_left and not action.running_parts:
            self.start_part(action, again=True)  # keeps its units and memory
            return False
        self.mem_used_mb -= action.demand.mem_mb
        if action.running_parts:
            self.policy.finish(action, now)  # this part's units only
            return False
        del self.running[action_id]
        self.finished += 1
        if action.failed:
            self.failed += 1
        else:
            self.predictor.observe(action.shape, action.hint_s, action.run_s)
        self.policy.finish(action, now)
        return True

    def end_trajectory(self, trajectory: str, now: float) -> list[Action]:
        """The trajectory is over: its waiting actions are dropped and returned, a running suite of it
        starts no more parts (it finishes as failed), and `static` gives its bundle back."""
        now = self._advance(now)
        for action in [a for a in self.unstarted.values() if a.trajectory == trajectory]:
            action.stopped = action.failed = True
            del self.unstarted[action.id]
        dropped = [self.waiting.pop(i) for i in sorted(self.waiting_by_trajectory.pop(trajectory, set()))]
        self.policy.end_trajectory(trajectory, dropped, now)
        return dropped

    def pool_size(self, resource: str) -> int:
        """Units allocated now (busy, idle or starting): the workers the service should keep."""
        return self.policy.allocated(resource)

    def next_event(self, now: float) -> float | None:
        """The next time something changes with no other call (a unit ready, an idle unit given back)."""
        self._advance(now)
        return self.policy.next_event()

    def stats(self, now: float) -> dict[str, float]:
        """Counters and unit-second integrals since the first allocation, up to `now`."""
        now = self._advance(now)
        out: dict[str, float] = {
            "queued": len(self.waiting),
            "running": len(self.running),
            "finished": self.finished,
            "failed": self.failed,
            "mem_used_mb": self.mem_used_mb,
        }
        for r, usage in self.usage.items():
            allocated_s, busy_s = usage.totals(now)
            out[f"{r}_units"] = self.pool_size(r)
            out[f"{r}_peak_units"] = usage.peak
            out[f"{r}_allocated_unit_s"] = allocated_s
            out[f"{r}_busy_unit_s"] = busy_s
            out[f"{r}_utilisation"] = busy_s / allocated_s if allocated_s > 0 else 0.0
        return out

    def check_fits(self, demand: Demand, what: str) -> None:
        if demand.mem_mb > self.mem_budget_mb:
            raise ValueError(
                f"{what} needs {demand.mem_mb} MB, more than the memory budget of {self.mem_budget_mb} MB"
            )
        for r in RESOURCES:
            if (n := demand.units(r)) > (ceiling := self.pools[r].ceiling):
                raise ValueError(f"{what} needs {n} {r} units, more than the {r} pool's ceiling of {ceiling}")

    def is_waiting(self, action: Action) -> bool:
        """False once the action was dropped (queues forget dropped actions lazily)."""
        return self.waiting.get(action.id) is action

    def mem_free(self) -> int:
        return self.mem_budget_mb - self.mem_used_mb

    def start(self, action: Action) -> None:
        """Book-keeping common to all policies when `action` starts (its units are the policy's)."""
        del self.waiting[action.id]
        ids = self.waiting_by_trajectory[action.trajectory]
        ids.discard(action.id)
        if not ids:
            del self.waiting_by_trajectory[action.trajectory]
        self.running[action.id] = action
        self.start_part(action)

    def start_part(self, action: Action, again: bool = False) -> None:
        """A part of running `action` starts: on the units its last part held (`again`, listed by
        the next `dispatch`), or on units the policy just took for it."""
        action.started_parts += 1
        action.running_parts += 1
        if action.parts_left:
            self.unstarted[action.id] = action
        else:
            self.unstarted.pop(action.id, None)
        if again:
            self.again.append(action)
            return
        self.mem_used_mb += action.demand.mem_mb
        assert self.mem_used_mb <= self.mem_budget_mb, (self.mem_used_mb, self.mem_budget_mb)

    @property
    def unstarted_units(self) -> dict[str, int]:
        """The units the parts not started yet of running actions ask for, per resource."""
        return {r: sum(a.demand.units(r) * a.parts_left for a in self.unstarted.values()) for r in RESOURCES}

    def _advance(self, now: float) -> float:
        now = max(now, self.t)
        self.t = now
        self.policy.advance(now)
        return now
