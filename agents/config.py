"""The swarm description's `[tasks.<name>]` (`TaskConf`) and `[run]` (`RunConf`) tables, declared
beside the runner that plays them; `swarmrl.swarm` composes the whole description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from swarmrl.core.config import Strict, SwarmConfigError


class TaskConf(Strict):
    """One task: its mixing weight, which model plays which role, and the clients that play it."""

    weight: float = Field(default=1.0, gt=0)
    """Mixing weight: the task's share of new GRPO groups is weight / sum of weights."""
    roles: dict[str, str] = {}
    """Role (agent name) -> model. Empty: a single-agent task played by the swarm's only model."""
    clients: int = Field(default=2, ge=0)
    """Client processes playing this task (0: only outside agents feed it; with no `data`, `env` or
    `command`, that declares an outside agent's task)."""
    concurrency: int = Field(default=2, ge=1)
    """GRPO groups each built-in client plays at once."""
    command: list[str] | None = None
    """Client command line (argv); None = the built-in Python runner. It gets `SWARMRL_CONNECT_FILE`
    (the connection details, JSON) and `SWARMRL_TASK`."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Max tokens per model reply in this task's episodes; None: `[run] max_tokens`."""
    eval: bool = True
    """Evaluate held-out success (not for a `command` client's task: no held-out set here)."""

    # A dataset task (`data` set): rows of prompts and a reward function, played by the built-in runner.
    data: list[str] = []
    """Dataset task: local JSONL / JSON / Parquet / CSV files, or one `save_to_disk` directory;
    relative to the swarm file's folder."""
    eval_data: list[str] = []
    """The held-out rows; empty: a saved `DatasetDict`'s `test` / `validation` split, else
    `heldout` of `data`."""
    heldout: float = Field(default=0.1, gt=0, lt=1)
    """Share of `data` held out for evaluation when `eval_data` is not given."""
    split_seed: int = 0
    """Seed of the held-out carve."""
    prompt: str = "prompt"
    """Column with the user prompt (text)."""
    messages: str = ""
    """Column with the opening chat messages (a list of OpenAI messages) instead of `prompt`."""
    system: str = ""
    """System prompt put before a text prompt."""
    reward: str = ""
    """The reward function, `file.py:function` or `package.module:function`, with TRL's signature
    `f(prompts, completions, **columns) -> list[float]` (sync or async)."""
    answer: str = ""
    """Column of reference answers, for an SFT warm start on this task (optional)."""
    warm_start_rows: int = Field(default=0, ge=0)
    """Training rows (the first ones) the warm start may use; 0: all."""
    success_at: float = 1.0
    """An episode is a success when its reward is at least this."""
    env: str = ""
    """An environment of your own, `file.py:Class` or `package.module:Class`
    (`swarmrl.agents.tasks.environment`): multi-turn, with tools."""
    max_turns: int = Field(default=10, ge=1)
    """Model calls per episode of an `env` task before it is cut (tool calls count)."""
    sandbox: bool = False
    """`env` task: run its tools as sandboxed python actions instead of in the client; they must then
    be plain functions of a file that needs only the standard library."""

    @field_validator("data", "eval_data", mode="before")
    @classmethod
    def _paths(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _dataset(self) -> TaskConf:
        if self.own and self.command is not None:
            raise ValueError("a dataset or env task is played by the built-in runner: drop `command`")
        if self.env and self.reward:
            raise ValueError("an env task's reward is its environment's: drop `reward`")
        if self.data and not self.env and not self.reward:
            raise ValueError('a dataset task needs reward = "file.py:function" (or "module:function")')
        if not self.data and (self.eval_data or self.reward):
            raise ValueError("eval_data / reward are for a dataset task: give data = [...] too")
        return self

    @property
    def own(self) -> bool:
        """A task of the user's own that the built-in runner plays (`data` or `env`)."""
        return bool(self.data or self.env)

    def resolve_paths(self, base: Path) -> TaskConf:
        """Data files and a `file.py:name` reward or env made absolute against `base`."""
        return self.model_copy(
            update={
                "data": [str((base / p).resolve()) for p in self.data],
                "eval_data": [str((base / p).resolve()) for p in self.eval_data],
                "reward": _resolve_object(self.reward, base),
                "env": _resolve_object(self.env, base),
            }
        )


def _resolve_object(spec: str, base: Path) -> str:
    """`file.py:name` (or a module beside the swarm file) made an absolute path; others as they are."""
    file, sep, name = spec.rpartition(":")
    beside = base / (file.replace(".", "/") + ".py")
    if sep and (file.endswith(".py") or "/" in file):
        return f"{(base / file).resolve()}:{name}"
    if sep and beside.exists():
        return f"{beside.resolve()}:{name}"
    return spec


class RunConf(Strict):
    """Budget, evaluation and client settings of the whole run."""

    steps: int = Field(default=300, ge=1)
    """Trainer steps per model: the run ends when the first trainer reaches it, or when time is up."""
    minutes: float = Field(default=15.0, gt=0)
    """Wall-clock budget."""
    eval_every: int = Field(default=10, ge=1)
    """Evaluate each task's lead model (its first role's) every N versions."""
    eval_limit: int = Field(default=0, ge=0)
    """Eval instances per task (0 = the whole held-out set)."""
    eval_samples: int = Field(default=4, ge=1)
    """Episodes per held-out instance."""
    eval_temperature: float = Field(default=1.0, ge=0)
    """Eval sampling temperature (1.0 = the policy being trained, 0 = greedy)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Max tokens per model reply in every task that sets none; None: each task's own need (48 for
    the built-in tasks, else the gateway's `default_max_tokens`)."""
    abort_rate: float = Field(default=0.0, ge=0, lt=1)
    """Chaos: per-turn probability that a built-in client fails an episode on purpose."""
    seed: int = Field(default=0, ge=0)
    """Seed of the run: trainers, embedded engines' samplers and the built-in clients' task streams."""
    actions: Literal["elastic", "fifo", "static", "off"] = "elastic"
    """Scheduling policy of the tasks' tools run as sandboxed python actions; `off` runs them inside
    the client processes."""


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
