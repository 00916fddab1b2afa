"""What the swarm description says about the tasks and the run, as the built-in clients read it.

`TaskConf` (one `[tasks.<name>]` table) and `RunConf` (the `[run]` table) are declared here, beside
the runner that plays them, so a client imports its own settings and not the command line above it;
`swarmrl.swarm` composes them into the whole description. `parse_task_weights` reads the task mix
(`calculator=0.7,guess_number=0.3`) of `--task`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from swarmrl.core.config import Strict, SwarmConfigError


class TaskConf(Strict):
    """One task: its mixing weight, which model plays which role, and the clients that play it."""

    weight: float = 1.0
    """Mixing weight: the task's share of new GRPO groups is weight / sum of weights."""
    roles: dict[str, str] = {}
    """Role (agent name) -> model. Empty: a single-agent task played by the swarm's only model."""
    clients: int = Field(default=2, ge=0)
    """Client processes playing this task (0: only outside agents feed it)."""
    concurrency: int = Field(default=2, ge=1)
    """GRPO groups each built-in client plays at once."""
    command: list[str] | None = None
    """Client command line (argv); None = the built-in Python runner. It gets the connection details
    in `SWARMRL_CONNECT_FILE` (JSON: nats_url, user, password, models) and `SWARMRL_TASK`."""
    eval: bool = True
    """Evaluate held-out success (built-in tasks only)."""

    @field_validator("weight")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"weight must be > 0, got {v}")
        return v


class RunConf(Strict):
    """Budget, evaluation and client settings of the whole run."""

    steps: int = Field(default=300, ge=1)
    """Trainer steps per model. The run ends when the first trainer reaches it (a team's other model
    could not go on training alone) or when the budget is spent."""
    minutes: float = Field(default=15.0, gt=0)
    """Wall-clock budget."""
    eval_every: int = Field(default=10, ge=1)
    """Evaluate each task's lead model (its first role's model) every N versions; when an evaluation
    takes longer than N versions, the next one is of the newest version."""
    eval_limit: int = Field(default=0, ge=0)
    """Eval instances per task (0 = the whole held-out set)."""
    eval_samples: int = Field(default=4, ge=1)
    """Episodes per held-out instance."""
    eval_temperature: float = Field(default=1.0, ge=0)
    """Eval sampling temperature (1.0 = the policy being trained, 0 = greedy)."""
    max_tokens: int = Field(default=48, ge=1)
    """Max tokens per model reply."""
    abort_rate: float = Field(default=0.0, ge=0, lt=1)
    """Chaos: per-turn probability that a built-in client fails an episode on purpose."""
    seed: int = Field(default=0, ge=0)
    """Seed of the run: trainers (torch/numpy/random), embedded engines' samplers and the built-in
    clients' task streams. 0 gives what `swarmrl up` always did; `swarmrl research` sets one per run."""
    actions: Literal["elastic", "fifo", "static", "off"] = "elastic"
    """Tools of the tasks that have them (calculator) run as sandboxed python actions through the
    actions service, scheduled with this policy; `off` runs them inside the client processes."""


def parse_task_weights(text: str) -> dict[str, float]:
    """`calculator=0.7,guess_number=0.3` (or `calculator,guess_number`: equal weights)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, weight = part.partition("=")
        if name in out:
            raise SwarmConfigError(f"--task: {name!r} is named twice")
        try:
            out[name] = float(weight) if weight else 1.0
        except ValueError:
            raise SwarmConfigError(f"--task: weight of {name!r} is not a number: {weight!r}") from None
    if not out:
        raise SwarmConfigError("--task: no task given")
    return out
