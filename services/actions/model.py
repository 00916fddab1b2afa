"""Shared types of the actions service (pure, no NATS): what an action asks for and how it ended."""

from __future__ import annotations

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
