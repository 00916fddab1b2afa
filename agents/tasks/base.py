"""Shared shapes of the tasks: OpenAI-format messages in, environment replies out.

A single-agent task (`TaskSpec.roles` empty) is played like this:

    env = spec.make_env(instance)
    messages = env.reset()                      # [system, user]
    while True:
        reply = <assistant message from the model>
        messages.append(reply)
        step = env.step(reply)
        messages += step.messages               # user / tool messages for the next call
        if step.done:
            break
    env.reward, env.success

A multi-role task is a team, each role played by its own model (a `MultiRoleEnv`):

    while (turn := env.turn()) is not None:
        env.step(<reply from model_of[turn.role], given turn.messages and turn.tools>)
    env.rewards[role], env.success, env.metrics

No NATS, no LLM calls, no randomness after construction: the same instance and replies always give
the same rewards, which GRPO groups by `task_id` rely on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]  # one OpenAI chat message

_INT_RE = re.compile(r"-?\d+")


@dataclass
class StepResult:
    """What the environment answers to one assistant reply."""

    messages: list[Message]
    """Messages (user or tool) to append before the next model call."""
    done: bool
    """True when the episode is over; `Env.reward` is then final."""
    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics, for logs and tests only."""


class Env(Protocol):
    """One episode of a task. One whose reward needs awaiting (a dataset task's) also has
    `async def settle()`, awaited once the episode is done."""

    reward: float
    success: bool

    def reset(self) -> list[Message]: ...

    def step(self, reply: Message) -> StepResult: ...


@dataclass
class Turn:
    """One model call a multi-role episode asks for next."""

    role: str
    """The role (agent name) whose model makes this call."""
    messages: list[Message]
    """The whole conversation that role sees, ending where its reply goes."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool specs to pass with the call."""


class MultiRoleEnv(Protocol):
    """One episode of a multi-role task: `turn()` / `step(reply)` until `turn()` is None."""

    done: bool
    success: bool
    """Whether the team reached the task's goal; final once `done`."""
    rewards: dict[str, float]
    """Reward per role that acted; final once `done`."""
    metrics: dict[str, float]
    """Per-role diagnostics of the roles that acted (see `TaskSpec.role_metrics`)."""

    def turn(self) -> Turn | None:
        """The next model call to make, or None when the episode is over."""

    def step(self, reply: Message) -> None:
        """Take the reply to the last `turn()`."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything the rest of swarmrl needs to know about one task, by name in `TASKS`."""

    name: str
    make_env: Callable[[Any], Any]
    """Instance -> a fresh `Env` when `roles` is empty, else a `MultiRoleEnv`."""
    train_tasks: Callable[[int], Iterator[Any]]
    """Seed -> endless stream of training instances, never one from the eval set."""
    eval_tasks: Callable[[], list[Any]]
    """The fixed held-out eval set (the same everywhere)."""
    demonstration: Callable[[Any, random.Random], list[Message]] | None
    """(instance, rng) -> a synthetic episode for the SFT warm start; None: none (or multi-role)."""
    parse_reply: Callable[[Message], Any]
    """Assistant message -> the parsed action (None when invalid)."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool specs to pass with every chat call (single-agent tasks; see `role_tools`)."""
    tool_actions: Callable[[Message], list[dict[str, Any] | None]] | None = None
    """Reply -> per tool call, the sandbox `python` action computing its result (None: the env
    answers it); `--tool-actions` passes the results to `env.step(reply, tool_results=...)`."""
    sft_weight: int = 1
    """Relative share of the SFT warm-start batches (more for skills slow to learn)."""
    roles: tuple[str, ...] = ()
    """The roles of a team task, each its own agent (and maybe model); empty: single-agent."""
    role_metrics: dict[str, str] = field(default_factory=dict)
    """Role -> the `MultiRoleEnv.metrics` entry measuring that role's own contribution."""
    role_demonstrations: Callable[[Any, random.Random], dict[str, list[Message]]] | None = None
    """(instance, rng) -> per role, a synthetic conversation ending in that role's reply."""
    role_tools: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    role_sft_weights: dict[str, int] = field(default_factory=dict)
    """Role -> `sft_weight` of a warm start on that role (default: the task's `sft_weight`)."""
    role_oracle: Callable[[Any, Turn], Message] | None = None
    """(instance, turn) -> a correct reply: the scripted partner when one role's model is measured alone."""
    sft_tasks: Callable[[int], Iterator[Any]] | None = None
    """Seed -> the instances a warm start demonstrates; None: `train_tasks`."""
    max_tokens: int | None = 48
    """Max tokens per reply when the swarm description sets none; None: the gateway's default."""
    fingerprint: str = ""
    """Hash of what the instances are made from beyond the code (a dataset's rows): in the cache key
    of a model warm-started on it."""

    def __post_init__(self) -> None:
        if self.roles and self.role_demonstrations is None:
            raise ValueError(f"task {self.name!r}: a multi-role task needs role_demonstrations")
        unknown = {*self.role_metrics, *self.role_tools, *self.role_sft_weights} - set(self.roles)
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown roles {sorted(unknown)}; roles are {self.roles}")


class TurnEnv:
    """Bookkeeping of the built-in environments: opening messages, turn count, no step after the end."""

    system_prompt = ""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.turns = 0
        self.reward = 0.0
        self.success = False
        self.done = False

    def reset(self) -> list[Message]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.task.user_prompt()},
        ]

    def _next_turn(self) -> None:
        if self.done:
            raise RuntimeError(f"step() after the episode ended ({self.task.task_id}, turn {self.turns})")
        self.turns += 1


def message_text(message: Message) -> str:
    """The text of a message's content, whether a string, None, or a list of OpenAI content parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def parse_single_int(text: str) -> int | None:
    """The integer in `text` when there is exactly one, else None: a hedge ("12 or 13") is refused."""
    found = _INT_RE.findall(text)
    return int(found[0]) if len(found) == 1 else None
