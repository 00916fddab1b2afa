"""The scheduling policies `static`, `fifo` and `elastic` (pure; what they share: `scheduler.py`)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from swarmrl.services.actions import model
from swarmrl.services.actions.model import RESOURCES, Action, Demand, Units

if TYPE_CHECKING:
    from swarmrl.services.actions.scheduler import Scheduler


class Policy:
    """How waiting actions are ordered and how many units are held. Each policy keeps its own queues
    and units, calls `Scheduler.start` for every action it starts, and has `submit`, `dispatch`,
    `finish` (a part ended), `end_trajectory`, `advance` (apply the timed changes due by `now`),
    `next_event` and `allocated` (units held of a resource)."""

    name: ClassVar[str]

    def __init__(self, s: Scheduler) -> None:
        self.s = s

    def check(self, action: Action) -> None:
        """Raise ValueError if the policy could never run `action` (after the common checks)."""


NO_RESERVATION = {"mem": 0, **{r: 0 for r in RESOURCES}}


class SharedUnits(Policy):
    """Base of `fifo` and `elastic`: every action takes units from one shared pool per resource, and
    waits in its resource's queue in `key` order (then arrival order)."""

    shrinks: ClassVar[bool] = False
    """Pools start at their floor and give idle units back (`elastic`); else fixed at the ceiling."""
    backfill: ClassVar[int] = 0
    """How many actions behind one that does not fit are tried per dispatch (0: head-of-line)."""

    def __init__(self, s: Scheduler) -> None:
        super().__init__(s)
        self.units = {r: Units(s.pools[r], s.usage[r]) for r in RESOURCES}
        self.queues: dict[str, list[tuple[float, int, Action]]] = {r: [] for r in RESOURCES}
        self.seq = itertools.count()
        self.wanted = {r: 0 for r in RESOURCES}
        """Units asked for by waiting actions (every part of a suite), per resource."""
        self.started = False

    def key(self, action: Action) -> float:
        """Start order, fixed at submit (so a heap keeps it); equal keys keep arrival order."""
        return 0.0

    def want(self, action: Action, sign: int) -> None:
        for r in RESOURCES:
            self.wanted[r] += sign * action.demand.units(r) * action.parts

    def submit(self, action: Action, now: float) -> None:
        if not self.started:
            self.started = True
            for u in self.units.values():
                u.grow(u.spec.floor if self.shrinks else u.spec.ceiling, now)
        heapq.heappush(self.queues[model.queue_of(action.demand)], (self.key(action), next(self.seq), action))
        self.want(action, +1)

    def end_trajectory(self, trajectory: str, dropped: list[Action], now: float) -> None:
        for action in dropped:  # the queues skip them lazily
            self.want(action, -1)

    def fits(self, d: Demand, reserved: dict[str, int]) -> bool:
        """Enough free units and memory for `d` after what `reserved` keeps for others (a reservation
        larger than what is free leaves nothing, but blocks nothing else)."""
        if d.mem_mb > max(0, self.s.mem_free() - reserved["mem"]):
            return False
        return all(d.units(r) <= max(0, u.free - reserved[r]) for r, u in self.units.items())

    def drain(
        self, r: str, queue: list[tuple[float, int, Action]], reserved: dict[str, int], now: float,
        out: list[Action],
    ) -> None:  # fmt: skip
        """Start what fits, in key order. The first action that does not fit reserves its demand in
        `reserved`; after it, at most `backfill` more are tried."""
        skipped: list[tuple[float, int, Action]] = []
        # Every action in this queue needs a unit of `r`: with none left, none can start.
        while queue and self.units[r].free - reserved[r] > 0 and len(skipped) <= self.backfill:
            entry = heapq.heappop(queue)
            action = entry[2]
            if not self.s.is_waiting(action):  # dropped by end_trajectory
                continue
            if self.fits(action.demand, reserved):
                self.run(action, now)
                self.want(action, -1)
                out.append(action)
                continue
            if not skipped:
                reserved["mem"] += action.demand.mem_mb
                for res in RESOURCES:
                    reserved[res] += action.demand.units(res)
            skipped.append(entry)
        for entry in skipped:
            heapq.heappush(queue, entry)

    def run(self, action: Action, now: float, extra: bool = False) -> None:
        """Take `action`'s units and start it, or (`extra`) one more of its parts."""
        for r, u in self.units.items():
            u.take(action.demand.units(r), now)
        if extra:
            self.s.start_part(action)
        else:
            self.s.start(action)

    def finish(self, action: Action, now: float) -> None:
        """A part of `action` ended (its last, or one of several running): its units are free."""
        for r, u in self.units.items():
            u.give(action.demand.units(r), now)

    def advance(self, now: float) -> None:
        for u in self.units.values():
            u.advance(now, self.shrinks)

    def next_event(self) -> float | None:
        return min((d[0] for u in self.units.values() if (d := u.due(self.shrinks))), default=None)

    def allocated(self, resource: str) -> int:
        return self.units[resource].size


class Fifo(SharedUnits):
    """A fixed pool of `ceiling` units; arrival order, and an action that does not fit blocks the ones
    behind it (head-of-line)."""

    name = "fifo"

    def dispatch(self, now: float) -> list[Action]:
        out: list[Action] = []
        for r, queue in self.queues.items():  # a blocked head holds nothing back in the other queue
            self.drain(r, queue, dict(NO_RESERVATION), now, out)
        return out


class Elastic(SharedUnits):
    """A pool between floor and ceiling, grown for the units waiting actions (and unstarted parts)
    ask for and shrunk by idle release. Waiting actions start in order of `submitted + aging_s * p /
    (p + PRED_SCALE_S)`, `p` their predicted run time: shortest first, yet none is ordered behind one
    that arrived more than `aging_s` after it, so none starves. The first that does not fit reserves
    its demand; the ones after it only backfill what is left, so small ones cannot keep a big one
    out. Spare units then go to running actions' parts not started yet (`spread`)."""

    name = "elastic"
    shrinks = True
    backfill = model.BACKFILL_DEPTH

    def key(self, action: Action) -> float:
        p = self.s.predictor.predict(action.shape, action.hint_s)
        return action.submitted + self.s.aging_s * p / (p + model.PRED_SCALE_S)

    def grow(self, now: float) -> None:
        unstarted = self.s.unstarted_units
        for r, u in self.units.items():
            short = self.wanted[r] + unstarted[r] - u.free - len(u.starting)
            n = min(short, u.spec.ceiling - u.size)
            if n > 0:
                u.grow(n, now)

    def dispatch(self, now: float) -> list[Action]:
        self.grow(now)
        out: list[Action] = []
        reserved = dict(NO_RESERVATION)
        for r, queue in self.queues.items():
            self.drain(r, queue, reserved, now, out)
        if self.s.unstarted:
            self.spread(reserved, now, out)
        return out

    def spread(self, reserved: dict[str, int], now: float, out: list[Action]) -> None:
        """Units no waiting action took or reserved go to running actions' parts not started yet,
        least predicted remaining work first."""

        def remaining(a: Action) -> float:
            return self.s.predictor.predict(a.shape, a.hint_s) * a.parts_left / a.parts

        for r, u in self.units.items():
            if u.free - reserved[r] <= 0:
                continue
            wanting = [a for a in self.s.unstarted.values() if model.queue_of(a.demand) == r]
            for action in sorted(wanting, key=remaining):
                while action.parts_left and self.fits(action.demand, reserved):
                    self.run(action, now, extra=True)
                    out.append(action)
                if u.free - reserved[r] <= 0:
                    break


@dataclass(eq=False)
class Trajectory:
    """A `static` trajectory: its bundle and its actions waiting to run in it."""

    id: str
    actions: deque[Action]
    bundle: Demand | None = None
    """Units held (None while waiting for a bundle)."""
    want: Demand | None = None
    """The bundle it waits for in the bundle queue."""
    ready_at: float = 0.0
    running: bool = False
    ended: bool = False


class Static(Policy):
    """A bundle of units per trajectory (`static_bundle`, or its first action's demand with at least
    one cpu), held from its first action until it ends; its actions run one at a time in it, and
    trajectories wait first come first served for a bundle. An action bigger than its bundle gives
    the bundle back and queues for one covering both: a bundle is always taken whole, so two
    trajectories never wait on each other."""

    name = "static"

    def __init__(self, s: Scheduler) -> None:
        super().__init__(s)
        self.trajectories: dict[str, Trajectory] = {}
        self.held = {r: 0 for r in RESOURCES}
        self.busy = {r: 0 for r in RESOURCES}
        self.bundle_queue: deque[Trajectory] = deque()
        self.starting: list[tuple[float, int, Trajectory]] = []
        self.seq = itertools.count()
        # Ordered sets: a dict keeps insertion order, and a trajectory added again keeps its place.
        self.runnable: dict[Trajectory, None] = {}
        """Trajectories that may be able to start their next action."""
        self.mem_blocked: dict[Trajectory, None] = {}

    def first_bundle(self, action: Action) -> Demand:
        if self.s.static_bundle is not None:
            return self.s.static_bundle
        d = action.demand
        return Demand(cpu=max(1, d.cpu), mem_mb=d.mem_mb, accel=d.accel)

    def check(self, action: Action) -> None:
        tr = self.trajectories.get(action.trajectory)
        if tr is None:
            self.s.check_fits(self.first_bundle(action), f"the static bundle of action {action.id!r}")
        elif tr.ended:
            raise ValueError(
                f"action {action.id!r}: trajectory {tr.id!r} has ended (its last action still runs)"
            )

    def submit(self, action: Action, now: float) -> None:
        tr = self.trajectories.get(action.trajectory)
        if tr is None:
            tr = self.trajectories[action.trajectory] = Trajectory(action.trajectory, deque())
            tr.want = self.first_bundle(action)
            self.bundle_queue.append(tr)
        tr.actions.append(action)
        self.runnable[tr] = None

    def add(self, counts: dict[str, int], demand: Demand, sign: int, now: float) -> None:
        """Add (or take away) `demand`'s units to `held` or `busy`, and meter the change."""
        for r in RESOURCES:
            counts[r] += sign * demand.units(r)
            self.s.usage[r].record(now, self.held[r], self.busy[r])

    def dispatch(self, now: float) -> list[Action]:
        out: list[Action] = []
        progress = True
        while progress:
            progress = self.grant(now)
            while self.runnable:
                tr = next(iter(self.runnable))
                del self.runnable[tr]
                progress |= self.step(tr, now, out)
        return out

    def grant(self, now: float) -> bool:
        """Give bundles to waiting trajectories, in arrival order, while they fit."""
        granted = False
        while self.bundle_queue:
            tr = self.bundle_queue[0]
            want = tr.want
            if tr.ended or want is None:
                self.bundle_queue.popleft()
                continue
            if any(want.units(r) > self.s.pools[r].ceiling - self.held[r] for r in RESOURCES):
                break
            self.bundle_queue.popleft()
            tr.bundle, tr.want = want, None
            self.add(self.held, want, +1, now)
            warmup = max((self.s.pools[r].start_s for r in RESOURCES if want.units(r)), default=0.0)
            tr.ready_at = now + warmup
            if warmup > 0:
                heapq.heappush(self.starting, (tr.ready_at, next(self.seq), tr))
            else:
                self.runnable[tr] = None
            granted = True
        return granted

    def step(self, tr: Trajectory, now: float, out: list[Action]) -> bool:
        """Start `tr`'s next action if its bundle is ready; True if units were given back."""
        if tr.running or not tr.actions or tr.bundle is None or tr.ready_at > now:
            return False
        action = tr.actions[0]
        if any(action.demand.units(r) > tr.bundle.units(r) for r in RESOURCES):
            self.add(self.held, tr.bundle, -1, now)
            tr.bundle, tr.want = None, model.cover(tr.bundle, action.demand)
            self.bundle_queue.append(tr)
            return True
        if action.demand.mem_mb > self.s.mem_free():
            self.mem_blocked[tr] = None
            return False
        tr.actions.popleft()
        tr.running = True
        self.add(self.busy, action.demand, +1, now)
        self.s.start(action)
        out.append(action)
        return False

    def finish(self, action: Action, now: float) -> None:
        tr = self.trajectories[action.trajectory]
        tr.running = False
        self.add(self.busy, action.demand, -1, now)
        free = self.s.mem_free()
        while self.mem_blocked:  # wake the memory-blocked ones that now fit, in order
            head = next(iter(self.mem_blocked))
            need = head.actions[0].demand.mem_mb if head.actions else 0
            if need > free:
                break
            free -= need
            del self.mem_blocked[head]
            self.runnable[head] = None
        if tr.ended:
            self.release(tr, now)
        else:
            self.runnable[tr] = None

    def end_trajectory(self, trajectory: str, dropped: list[Action], now: float) -> None:
        tr = self.trajectories.get(trajectory)
        if tr is None:
            return
        tr.actions.clear()
        tr.ended = True
        if not tr.running:
            self.release(tr, now)

    def release(self, tr: Trajectory, now: float) -> None:
        if tr.bundle is not None:
            self.add(self.held, tr.bundle, -1, now)
            tr.bundle = None
        del self.trajectories[tr.id]

    def advance(self, now: float) -> None:
        while self.starting and self.starting[0][0] <= now:
            self.runnable[heapq.heappop(self.starting)[2]] = None

    def next_event(self) -> float | None:
        return self.starting[0][0] if self.starting else None

    def allocated(self, resource: str) -> int:
        return self.held[resource]


AnyPolicy = Static | Fifo | Elastic
POLICIES: dict[str, type[AnyPolicy]] = {p.name: p for p in (Static, Fifo, Elastic)}
