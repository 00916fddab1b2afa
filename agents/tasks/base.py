"""Shared shapes of the default tasks: OpenAI-format messages in, environment replies out.

A task is pure environment logic. An agent (or `swarmrl.bootstrap.evaluate_offline`) plays it:

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
    """One episode of a task."""

    reward: float
    success: bool

    def reset(self) -> list[Message]: ...

    def step(self, reply: Message) -> StepResult: ...


class TaskInstance(Protocol):
    """A task instance: anything frozen with a stable `task_id` (GRPO group key)."""

    @property
    def task_id(self) -> str: ...


@dataclass(frozen=True)
class TaskSpec:
    """Everything the rest of swarmrl needs to know about one task, by name in `TASKS`."""

    name: str
    """Registry name (`guess_number`, `calculator`)."""
    make_env: Callable[[Any], Env]
    """Instance -> a fresh episode environment."""
    train_tasks: Callable[[int], Iterator[Any]]
    """Seed -> endless stream of training instances, never one from the eval set."""
    eval_tasks: Callable[[], list[Any]]
    """The fixed held-out eval set (same list on every call and every machine)."""
    demonstration: Callable[[Any, random.Random], list[Message]]
    """(instance, rng) -> a full synthetic episode (messages) for the SFT warm start."""
    parse_reply: Callable[[Message], Any]
    """Assistant message -> the parsed action (None when invalid)."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool specs to pass with every chat call, or None."""
    sft_weight: int = 1
    """Relative share of the bootstrap SFT warm-start batches (a task whose skills take longer to
    learn gets more)."""


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
