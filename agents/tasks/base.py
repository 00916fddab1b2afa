"""Shared shapes of the default tasks: OpenAI-format messages in, environment replies out.

A task is pure environment logic. An agent (or `swarmrl.bootstrap.evaluate_offline`) plays a
single-agent task (`TaskSpec.roles` empty) like this:

    env = spec.make_env(instance)
    messages = env.reset()                      # [system, user]
    while True:
        reply = <assistant message from the model, OpenAI format>
        messages.append(reply)
        step = env.step(reply)
        messages += step.messages               # user / tool messages for the next call
        if step.done:
            break
    env.reward, env.success

A multi-role task (`TaskSpec.roles` non-empty) is a team of agents, each role played by its own
model; the environment says whose call comes next and what that call sees:

    env = spec.make_env(instance)               # a MultiRoleEnv
    while (turn := env.turn()) is not None:
        reply = <assistant message from model_of[turn.role], given turn.messages and turn.tools>
        env.step(reply)
    env.rewards[role] for each role that acted, env.success, env.metrics

No NATS, no LLM calls, no randomness after construction: a given task instance and the same
replies always give the same rewards, which is what GRPO groups by `task_id` rely on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

# One OpenAI chat message ({"role": ..., "content": ..., "tool_calls": [...]}).
Message = dict[str, Any]

_INT_RE = re.compile(r"-?\d+")


@dataclass
class StepResult:
    """What the environment answers to one assistant reply."""

    messages: list[Message]
    """Messages to append to the conversation before the next model call (user or tool role)."""
    done: bool
    """True when the episode is over; `Env.reward` is then final."""
    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics (parsed action, whether the reply was valid), for logs and tests only."""


class Env(Protocol):
    """One episode of a task. An environment whose reward needs awaiting (a dataset task's reward
    function may be async) also has `async def settle()`, which players await once the episode is
    done and before they read `reward` and `success`."""

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
    """The whole conversation that role sees (OpenAI format), ending where its reply goes."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool specs to pass with the call, or None."""


class MultiRoleEnv(Protocol):
    """One episode of a multi-role task: `turn()` / `step(reply)` until `turn()` is None."""

    done: bool
    """True once the episode is over (`turn()` then returns None)."""
    success: bool
    """Whether the team reached the task's goal; final once `done`."""
    rewards: dict[str, float]
    """Reward per role that acted (a role that never got a turn has no entry); final once `done`."""
    metrics: dict[str, float]
    """Per-role diagnostics (`TaskSpec.role_metrics` names the one measuring each role's own part);
    a metric of a role that did not act is absent."""

    def turn(self) -> Turn | None:
        """The next model call to make, or None when the episode is over."""
        ...

    def step(self, reply: Message) -> None:
        """Take the assistant reply to the last `turn()` (made by that turn's role)."""
        ...


class TaskInstance(Protocol):
    """A task instance: anything frozen with a stable `task_id` (GRPO group key)."""

    @property
    def task_id(self) -> str: ...


@dataclass(frozen=True)
class TaskSpec:
    """Everything the rest of swarmrl needs to know about one task, by name in `TASKS`."""

    name: str
    """Registry name (`guess_number`, `calculator`, `team_calculator`)."""
    make_env: Callable[[Any], Any]
    """Instance -> a fresh episode environment: an `Env` when `roles` is empty, else a `MultiRoleEnv`."""
    train_tasks: Callable[[int], Iterator[Any]]
    """Seed -> endless stream of training instances, never one from the eval set."""
    eval_tasks: Callable[[], list[Any]]
    """The fixed held-out eval set (same list on every call and every machine)."""
    demonstration: Callable[[Any, random.Random], list[Message]] | None
    """(instance, rng) -> a full synthetic episode (messages) for the SFT warm start; None for a
    multi-role task (see `role_demonstrations`), or a task that has none (it cannot be a warm-start
    source then)."""
    parse_reply: Callable[[Message], Any]
    """Assistant message -> the parsed action (None when invalid)."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool specs to pass with every chat call, or None (single-agent tasks; see `role_tools`)."""
    tool_actions: Callable[[Message], list[dict[str, Any] | None]] | None = None
    """Reply -> per tool call, the `python` action (payload {"code", "stdin"}) that computes its result
    in the actions service's sandbox, or None where the environment answers itself. With it, the
    runner's `--tool-actions` passes the results to `env.step(reply, tool_results=...)`."""
    sft_weight: int = 1
    """Relative share of the bootstrap SFT warm-start batches (a task whose skills take longer to
    learn gets more)."""
    roles: tuple[str, ...] = ()
    """Empty: a single-agent task (`make_env` returns an `Env`). Otherwise the roles of a team task,
    each played by its own agent (and possibly its own model); `make_env` returns a `MultiRoleEnv`."""
    role_metrics: dict[str, str] = field(default_factory=dict)
    """Role -> the name of the `MultiRoleEnv.metrics` entry measuring that role's own contribution."""
    role_demonstrations: Callable[[Any, random.Random], dict[str, list[Message]]] | None = None
    """(instance, rng) -> per role, a synthetic conversation ending in that role's reply (the SFT warm
    start of a model playing that role)."""
    role_tools: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Role -> the tool specs its calls carry (roles without tools are absent)."""
    role_sft_weights: dict[str, int] = field(default_factory=dict)
    """Role -> `sft_weight` of a warm start on that role (default: the task's `sft_weight`)."""
    role_oracle: Callable[[Any, Turn], Message] | None = None
    """(instance, turn) -> a correct reply for that turn: the scripted partner when one role's model
    is measured alone (`swarmrl bootstrap-model --eval` on a `task.role` source)."""
    sft_tasks: Callable[[int], Iterator[Any]] | None = None
    """Seed -> the instances a warm start demonstrates; None: `train_tasks`."""
    max_tokens: int | None = 48
    """Max tokens per reply when the swarm description sets none: what this task's replies need (the
    built-in tasks' answers are short). None: the gateway's `default_max_tokens`, capped by the
    model's context (dataset and environment tasks, whose replies only their author knows)."""
    fingerprint: str = ""
    """Hash of what the task's instances are made from beyond its code (a dataset's rows): part of the
    cache key of a model warm-started on it."""

    def __post_init__(self) -> None:
        if self.roles and self.role_demonstrations is None:
            raise ValueError(f"task {self.name!r}: a multi-role task needs role_demonstrations")
        unknown = (set(self.role_metrics) | set(self.role_tools) | set(self.role_sft_weights)) - set(
            self.roles
        )
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown roles {sorted(unknown)}; roles are {self.roles}")


class TurnEnv:
    """Bookkeeping shared by the default tasks' environments: the opening messages (system prompt and
    the task's user prompt), the turn counter, and the refusal to step an episode that has ended."""

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
    """The integer in `text` when there is exactly one, else None.

    Lenient on wording ("My guess: 12.") but refuses hedges ("12 or 13") that would let a model
    cover several answers in one reply.
    """
    found = _INT_RE.findall(text)
    return int(found[0]) if len(found) == 1 else None
