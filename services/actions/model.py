"""Shared types of the actions service (pure, no NATS): what an action asks for and how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

RESOURCES = ("cpu", "accel")
"""Unit pools a resource manager owns: CPU units (sandbox workers), accelerator slots (judge)."""

Status = Literal["ok", "error", "timeout", "killed", "rejected"]
"""How an action ended: `ok` ran to completion (the code may still have failed: see `exit_code`);
`error` the manager could not run it or the code raised; `timeout` past its wall-clock limit;
`killed` past a resource limit (CPU time, memory, processes); `rejected` never ran (bad input)."""


@dataclass(frozen=True)
class Demand:
    """Resources one action holds while it runs."""

    cpu: int = 1
    """CPU units (one unit = one sandbox worker)."""
    mem_mb: int = 256
    """Memory reserved (and enforced as its limit)."""
    accel: int = 0
    """Accelerator slots (one slot = one sequence in a judge batch)."""

    def units(self, resource: str) -> int:
        return self.cpu if resource == "cpu" else self.accel if resource == "accel" else 0


@dataclass
class Action:
    """One action waiting for, or holding, units."""

    id: str
    kind: str
    """`python` (code sandbox) or `judge` (model judge); the service maps kinds to managers."""
    demand: Demand
    trajectory: str
    """The episode (trajectory) it belongs to: `static` ties units to it."""
    submitted: float
    """Clock time of arrival (monotonic seconds, or virtual seconds in the simulator)."""
    hint_s: float | None = None
    """The caller's guess of its run time (all its parts, one after another), if any."""
    parts: int = 1
    """Independent parts (a test suite's cases), each run on `demand`'s units. `static` and `fifo`
    run them one after another on the units the action holds; `elastic` may run several at once
    on spare units (see `scheduler.py`)."""
    started_parts: int = 0
    running_parts: int = 0
    run_s: float = 0.0
    """Run time of its finished parts, summed."""
    failed: bool = False
    """A finished part did not run ok, or its trajectory ended before every part started."""
    stopped: bool = False
    """Its trajectory ended while it ran: it starts no more parts."""

    @property
    def shape(self) -> str:
        """What the run-time predictor learns from: the kind, and whether it is a suite (a suite's run
        time is its cases' sum, which says nothing about a single run of its kind)."""
        return self.kind if self.parts == 1 else f"{self.kind}-suite"

    @property
    def parts_left(self) -> int:
        """Parts still to start."""
        return 0 if self.stopped else self.parts - self.started_parts


@dataclass
class Outcome:
    """What a resource manager returns for one action."""

    status: Status
    result: dict[str, Any] = field(default_factory=dict)
    """Kind-specific: python → stdout, stderr, exit_code; judge → score."""
    error: str = ""
    run_s: float = 0.0
