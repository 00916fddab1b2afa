"""Shared types of the actions service (pure, no NATS): what an action asks for and how it ended;
and the scheduler's building blocks: pool limits, unit pools with warm-up and idle release,
unit-second meters and the per-kind run-time predictor."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from swarmrl.schemas.events import ActionStatus as Status

RESOURCES = ("cpu", "accel")
"""Unit pools: CPU units (sandbox workers) and accelerator slots (judge batch slots)."""


@dataclass(frozen=True)
class Demand:
    """Resources one action holds while it runs."""

    cpu: int = 1
    mem_mb: int = 256
    """Memory reserved, and enforced as its limit."""
    accel: int = 0

    def units(self, resource: str) -> int:
        return self.cpu if resource == "cpu" else self.accel if resource == "accel" else 0


@dataclass
class Action:
    """One action waiting for, or holding, units."""

    id: str
    kind: str
    """`python` (code sandbox) or `judge` (model judge)."""
    demand: Demand
    trajectory: str
    submitted: float
    """Arrival time (monotonic seconds, or virtual seconds in the simulator)."""
    hint_s: float | None = None
    """The caller's guess of its run time (all its parts together), if any."""
    parts: int = 1
    """Independent parts (a test suite's cases), each run on `demand`'s units."""
    started_parts: int = 0
    running_parts: int = 0
    run_s: float = 0.0
    """Run time of its finished parts, summed."""
    failed: bool = False
    """A part did not run ok, or its trajectory ended before every part started."""
    stopped: bool = False
    """Its trajectory ended while it ran: it starts no more parts."""

    @property
    def shape(self) -> str:
        """What the run-time predictor learns from: a suite's run time says nothing of a single run."""
        return self.kind if self.parts == 1 else f"{self.kind}-suite"

    @property
    def parts_left(self) -> int:
        return 0 if self.stopped else self.parts - self.started_parts


@dataclass
class Outcome:
    """What a resource manager returns for one action."""

    status: Status
    """`ok` ran to its end (see `exit_code`), `error` could not run or raised, `timeout` past its wall
    clock, `killed` past a CPU, memory or process limit, `rejected` never ran (bad input)."""
    result: dict[str, Any] = field(default_factory=dict)
    """Kind-specific: python → stdout, stderr, exit_code, ...; judge → score, ..."""
    error: str = ""
    run_s: float = 0.0


PRED_SCALE_S = 1.0
"""Run time at which a prediction uses half of `aging_s` in the elastic key (`policies.Elastic`)."""
DEFAULT_PRED_S = 1.0
"""Prediction for an action with no hint whose kind has no finished run yet."""
EWMA_ALPHA = 0.2
"""Weight of the newest run in the predictor's moving averages."""
BACKFILL_DEPTH = 32
"""How many actions behind a reserving one `elastic` tries per dispatch (bounds its cost)."""


@dataclass(frozen=True)
class PoolSpec:
    """Size limits and timing of one resource's pool."""

    floor: int
    """Units kept even when idle (`elastic`)."""
    ceiling: int
    """Most units ever allocated; an action or bundle asking for more is refused at submit."""
    idle_s: float = 5.0
    """An idle unit above the floor is given back after this long (`elastic`)."""
    start_s: float = 0.0
    """A unit (or a `static` bundle) is usable this long after it is allocated."""

    def __post_init__(self) -> None:
        if not 0 <= self.floor <= self.ceiling:
            raise ValueError(
                f"pool needs 0 <= floor <= ceiling, got floor={self.floor} ceiling={self.ceiling}"
            )
        if self.idle_s < 0 or self.start_s < 0:
            raise ValueError(f"pool times must be >= 0, got idle_s={self.idle_s} start_s={self.start_s}")


def queue_of(demand: Demand) -> str:
    """The resource an action waits in line for: `accel` if it asks for any, else `cpu`."""
    return "accel" if demand.accel > 0 else "cpu"


def cover(a: Demand, b: Demand) -> Demand:
    """The smallest demand that holds both `a` and `b`."""
    return Demand(cpu=max(a.cpu, b.cpu), mem_mb=max(a.mem_mb, b.mem_mb), accel=max(a.accel, b.accel))


@dataclass
class Usage:
    """Integral over time of the allocated and busy units of one resource."""

    t: float | None = None
    allocated: int = 0
    busy: int = 0
    allocated_s: float = 0.0
    busy_s: float = 0.0
    peak: int = 0

    def record(self, t: float, allocated: int, busy: int) -> None:
        """The counts change to these values at time `t` (never before the last record)."""
        self.allocated_s, self.busy_s = self.totals(t)
        self.t, self.allocated, self.busy = t, allocated, busy
        self.peak = max(self.peak, allocated)

    def totals(self, now: float) -> tuple[float, float]:
        """(allocated, busy) unit-seconds up to `now`."""
        dt = 0.0 if self.t is None else max(0.0, now - self.t)
        return self.allocated_s + self.allocated * dt, self.busy_s + self.busy * dt


class Units:
    """The shared units of one resource (`fifo`, `elastic`): busy, idle, and starting."""

    def __init__(self, spec: PoolSpec, usage: Usage) -> None:
        self.spec, self.usage = spec, usage
        self.busy = 0
        self.idle: deque[float] = deque()
        """When each free unit became idle, oldest first (taken newest first, given back oldest first)."""
        self.starting: deque[float] = deque()
        """When each starting unit becomes usable, soonest first."""
        self.t = 0.0

    @property
    def size(self) -> int:
        return self.busy + len(self.idle) + len(self.starting)

    @property
    def free(self) -> int:
        return len(self.idle)

    def grow(self, n: int, now: float) -> None:
        queue = self.starting if self.spec.start_s > 0 else self.idle
        queue.extend([now + self.spec.start_s] * n)
        self.record(now)

    def take(self, n: int, now: float) -> None:
        for _ in range(n):
            self.idle.pop()
        self.busy += n
        self.record(now)

    def give(self, n: int, now: float) -> None:
        self.busy -= n
        self.idle.extend([now] * n)
        self.record(now)

    def record(self, t: float) -> None:
        self.t = t
        self.usage.record(t, self.size, self.busy)

    def due(self, shrink: bool) -> tuple[float, bool] | None:
        """The next timed change: (time, is_a_start); None if there is none."""
        ready = self.starting[0] if self.starting else math.inf
        expire = math.inf
        if shrink and self.idle and self.size > self.spec.floor:
            expire = max(self.idle[0] + self.spec.idle_s, self.t)
        if ready == expire == math.inf:
            return None
        return (ready, True) if ready <= expire else (expire, False)

    def advance(self, now: float, shrink: bool) -> None:
        """Apply the starts and idle give-backs due by `now`, each at its own time (exact integrals)."""
        while (due := self.due(shrink)) is not None and due[0] <= now:
            if due[1]:  # a unit is ready
                self.idle.append(self.starting.popleft())
            else:
                self.idle.popleft()
            self.record(due[0])
        self.t = max(self.t, now)


class Predictor:
    """Run time of an action, learned online per kind from finished runs (EWMAs): with a hint,
    `hint_s * exp(b)`, `b` the kind's mean `log(run_s / hint_s)` (the hint orders actions, the history
    corrects its bias); without one, the kind's mean `run_s` (`DEFAULT_PRED_S` before it has one)."""

    def __init__(self) -> None:
        self.mean_s: dict[str, float] = {}
        self.log_bias: dict[str, float] = {}

    def predict(self, kind: str, hint_s: float | None) -> float:
        if hint_s is not None and hint_s > 0:
            return hint_s * math.exp(self.log_bias.get(kind, 0.0))
        return self.mean_s.get(kind, DEFAULT_PRED_S)

    def observe(self, kind: str, hint_s: float | None, run_s: float) -> None:
        run_s = max(run_s, 1e-3)
        self.mean_s[kind] = _ewma(self.mean_s.get(kind), run_s)
        if hint_s is not None and hint_s > 0:
            self.log_bias[kind] = _ewma(self.log_bias.get(kind), math.log(run_s / hint_s))


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + EWMA_ALPHA * (new - old)
