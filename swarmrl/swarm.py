"""The swarm description: which models train, which tasks their agents play, how many clients run.

One object, read by `swarmrl up` from a TOML file (`--config swarm.toml`) or built from the `up`
flags (the short form); flags given on the command line override the file. Nothing else in swarmrl
hard-codes a model name. Validation happens here, before any process starts, and every error names
the offending entry.

    [run]                          # budget and evaluation (all optional)
    minutes = 20

    [models.caller]                # one table per trainable model (name = subject token)
    base = "tiny"                  # a bootstrap preset (built offline on first use) or an HF model dir
    warm_start = ["team_calculator.caller"]   # preset only: SFT sources (task or task.role)
    lr = 1e-4

    [models.reporter]
    base = "tiny-llama"
    warm_start = ["team_calculator.reporter"]

    [tasks.team_calculator]        # one table per task (a built-in task name, or any name with a command)
    weight = 1.0                   # mixing weight among tasks (> 0)
    roles = { caller = "caller", reporter = "reporter" }   # role (agent) -> model
    clients = 2                    # client processes playing this task
    # command = ["node", "agents/examples/js/agent.mjs"]   # default: the built-in Python runner
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class SwarmConfigError(ValueError):
    """The swarm description is invalid; the message names the offending entry."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ModelConf(_Strict):
    """One trainable model: its base weights, its engine and its trainer."""

    base: str = "tiny"
    """Bootstrap preset name (`tiny`, `tiny-llama`; built offline on first use) or an HF model directory."""
    warm_start: list[str] | None = None
    """SFT sources of a preset's warm start (`calculator`, `team_calculator.caller`); None = the preset's own."""
    warm_start_steps: int | None = Field(default=None, ge=0)
    """SFT steps of a preset's warm start; None = the preset's default for its sources."""
    lr: float = Field(default=1e-4, gt=0)
    """Trainer learning rate."""
    num_repeat: int = Field(default=8, ge=2)
    """GRPO group size: episodes per task instance (every model of a task must agree)."""
    batch_groups: int = Field(default=4, ge=1)
    """Groups per trainer step."""
    micro_batch_tokens: int = Field(default=512, ge=2)
    """Trainer packed-row length (longer samples are truncated; small rows are fastest on CPU)."""
    max_backlog: int = Field(default=-1, ge=-1)
    """Gateway admission control for this model: hold new groups while this many samples wait
    (-1 = two trainer steps' worth, 0 = off)."""
    trainer_args: list[str] = []
    """Extra `swarmrl serve trainer` flags, e.g. ["--kl-coef=0.01"]."""
    engine_args: list[str] = []
    """Extra `swarmrl serve engine` flags."""

    def backlog(self) -> int:
        return self.max_backlog if self.max_backlog >= 0 else 2 * self.batch_groups * self.num_repeat


class TaskConf(_Strict):
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


class RunConf(_Strict):
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


class Swarm(_Strict):
    run: RunConf = RunConf()
    models: dict[str, ModelConf]
    tasks: dict[str, TaskConf]

    @model_validator(mode="after")
    def _check(self) -> Swarm:
        from swarmrl.agents.tasks import TASKS

        if not self.models:
            raise ValueError("no [models.<name>] table: a swarm trains at least one model")
        if not self.tasks:
            raise ValueError("no [tasks.<name>] table: a swarm plays at least one task")
        for name in [*self.models, *self.tasks]:
            if not _NAME_RE.match(name):
                raise ValueError(f"name {name!r} must be 1-64 of [A-Za-z0-9_-] (it becomes a NATS subject)")
        for name, task in self.tasks.items():
            spec = TASKS.get(name)
            if spec is None and task.command is None:
                raise ValueError(
                    f"[tasks.{name}]: unknown built-in task; known: {sorted(TASKS)} "
                    "(a task of your own needs a `command`)"
                )
            if not task.roles:
                if spec is not None and spec.roles:
                    raise ValueError(
                        f"[tasks.{name}]: roles {list(spec.roles)} each need a model: roles = {{...}}"
                    )
                if len(self.models) != 1:
                    raise ValueError(
                        f'[tasks.{name}]: roles = {{agent = "<model>"}} is needed with several models '
                        f"({sorted(self.models)})"
                    )
                task.roles = {"agent": next(iter(self.models))}
            for role, model in task.roles.items():
                if model not in self.models:
                    raise ValueError(
                        f"[tasks.{name}].roles.{role}: unknown model {model!r}; models: {sorted(self.models)}"
                    )
            if spec is not None and spec.roles and set(task.roles) != set(spec.roles):
                raise ValueError(
                    f"[tasks.{name}].roles: the task's roles are {sorted(spec.roles)}, got {sorted(task.roles)}"
                )
            repeats = {m: self.models[m].num_repeat for m in set(task.roles.values())}
            if len(set(repeats.values())) > 1:
                raise ValueError(f"[tasks.{name}]: its models disagree on num_repeat (group size): {repeats}")
        unused = set(self.models) - {m for t in self.tasks.values() for m in t.roles.values()}
        if unused:
            raise ValueError(
                f"models {sorted(unused)} are played by no task; give them a role or remove them"
            )
        return self

    # -- derived views -------------------------------------------------------------------------

    def task_models(self, task: str) -> list[str]:
        """The models of `task`, in role order, without repeats; the first is the task's lead."""
        return list(dict.fromkeys(self.tasks[task].roles.values()))

    def num_repeat(self, task: str) -> int:
        return self.models[self.task_models(task)[0]].num_repeat

    def weights(self) -> dict[str, float]:
        total = sum(t.weight for t in self.tasks.values())
        return {name: t.weight / total for name, t in self.tasks.items()}


def check_bases(swarm: Swarm) -> None:
    """Every model's base must be a known preset (with known warm-start sources) or an HF model dir."""
    from swarmrl.bootstrap.presets import PRESETS, validate_base

    for name, m in swarm.models.items():
        path = Path(m.base).expanduser()
        if m.base in PRESETS:
            try:
                validate_base(m.base, m.warm_start)
            except ValueError as exc:
                raise SwarmConfigError(f"[models.{name}]: {exc}") from None
        elif path.is_dir() and (path / "config.json").exists():
            if m.warm_start is not None or m.warm_start_steps is not None:
                raise SwarmConfigError(
                    f"[models.{name}]: warm_start and warm_start_steps apply to presets only, base is {path}"
                )
        else:
            raise SwarmConfigError(
                f"[models.{name}].base: {m.base!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                "nor an HF model directory (a folder with config.json)"
            )


def resolve_base(m: ModelConf) -> Path:
    """The model directory of `m`'s base, building a preset on first use (cached)."""
    from swarmrl.bootstrap.presets import PRESETS, ensure_model

    if m.base in PRESETS:
        return ensure_model(m.base, m.warm_start, m.warm_start_steps)
    return Path(m.base).expanduser().resolve()


def _errors(exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {msg}" if where else f"  {msg}")
    return "\n".join(lines)


def build(data: dict[str, Any], source: str) -> Swarm:
    """Validate a swarm description (the parsed TOML, or the short form's dict)."""
    try:
        return Swarm.model_validate(data)
    except ValidationError as exc:
        raise SwarmConfigError(f"invalid swarm description {source}:\n{_errors(exc)}") from None


def load(path: Path) -> dict[str, Any]:
    """Parse a swarm TOML file (not yet validated: flags may still override it)."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SwarmConfigError(f"swarm config {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:  # duplicate tables land here, with their line
        raise SwarmConfigError(f"swarm config {path} is not valid TOML: {exc}") from None


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
