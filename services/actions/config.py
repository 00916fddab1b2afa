"""Configuration of the actions service and of a standalone action worker. `ActionsSettings` is what a
swarm description's `[actions]` may set; `ActionsConfig` adds the policy (`[run] actions`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarmrl.core.config import ServiceConfig, Settings

KIND_RESOURCE = {"python": "cpu", "judge": "accel"}
"""Which unit pool runs each action kind."""


class WorkerLimits(Settings):
    """What a python action may use unless it asks for less (`mem_mb`, `timeout_s` of the request)."""

    sandbox: Literal["auto", "bwrap", "rlimit"] = "auto"
    """Isolation of python actions: bubblewrap where installed (auto), or a process with rlimits."""
    cpu_s: float = Field(default=10.0, gt=0)
    """CPU-time limit of one python action, per CPU unit it holds."""
    wall_s: float = Field(default=30.0, gt=0)
    """Default wall-clock limit of one action (a request's `timeout_s` may lower or raise it)."""
    max_wall_s: float = Field(default=300.0, gt=0)
    """Most wall-clock time any action may ask for."""
    judge_engine: str = ""
    """Engine URL (the embedded engine or SGLang) that scores `judge` actions; empty: no judge."""
    judge_tokenizer: str = ""
    """Tokenizer (model dir) of the judge model; empty: the engine's."""


class ActionsSettings(WorkerLimits):
    """Unit pools, memory and trajectories of the actions service."""

    cpu_floor: int = Field(default=1, ge=0)
    """Fewest CPU units (warm sandbox workers) kept in this process."""
    cpu_ceiling: int = Field(default=4, ge=0)
    """Most CPU units in this process (remote workers add their own)."""
    accel_floor: int = Field(default=0, ge=0)
    """Fewest accelerator slots (judge batch slots) kept."""
    accel_ceiling: int = Field(default=16, ge=0)
    """Most accelerator slots (the largest judge batch); 0 without a judge engine."""
    mem_budget_mb: int = Field(default=4096, ge=1)
    """Memory all running actions may reserve together."""
    idle_s: float = Field(default=10.0, gt=0)
    """Elastic: a unit idle this long is released (down to the floor)."""
    aging_s: float = Field(default=30.0, gt=0)
    """Elastic: the waiting time that outweighs the predicted run time (bounds starvation)."""
    trajectory_timeout_s: float = Field(default=600.0, gt=0)
    """A trajectory with no action for this long is over (its client died without saying so)."""
    max_payload_bytes: int = Field(default=256 * 1024, gt=0)
    """Largest action request; a larger one is rejected and dead-lettered."""
    local_workers: bool = True
    """Run units in this process; off, only `swarmrl serve action-worker` processes run actions."""
    record: bool = True
    """Publish every finished action on `swarm.metrics.action` (the ledger's `actions`)."""

    @model_validator(mode="after")
    def _check(self) -> ActionsSettings:
        for res in ("cpu", "accel"):
            floor, ceiling = getattr(self, f"{res}_floor"), getattr(self, f"{res}_ceiling")
            if floor > ceiling:
                raise ValueError(f"{res}_floor {floor} > {res}_ceiling {ceiling}")
        return self


class ActionsConfig(ServiceConfig, ActionsSettings):
    policy: Literal["static", "fifo", "elastic"] = "elastic"
    """`elastic` (shortest predicted first, pools grow and shrink), `fifo` (a fixed pool, first come
    first served) or `static` (each trajectory holds its own units for its whole life)."""


class WorkerConfig(ServiceConfig, WorkerLimits):
    kind: Literal["python", "judge"] = "python"
    """Which actions this worker runs."""
    units: int = Field(default=2, ge=1)
    """Units it offers (sandbox workers, or judge batch slots)."""
    name: str = ""
    """Worker name in the service's capacity table; default: host and pid."""
    heartbeat_s: float = Field(default=2.0, gt=0)
    """How often it announces its units; the service forgets it after three missed beats."""
