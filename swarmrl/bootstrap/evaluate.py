"""Offline evaluation: play a task's held-out eval set with plain `model.generate` sampling, no
swarm services involved. Works on any HF chat model using Qwen-style `<tool_call>` tags.

Multi-role tasks: `evaluate_offline(model, "team_calculator.caller")` measures one role's model alone
(its partners scripted as correct by the task's `role_oracle`), `evaluate_team` a whole team.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.agents.tasks import get_task
from swarmrl.agents.tasks.base import Message, TaskSpec

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class EvalResult:
    """Outcome of `evaluate_offline`."""

    task: str
    """The task, or the `<task>.<role>` source measured."""
    episodes: int
    success_rate: float
    """Share of episodes the task (the team, for a multi-role task) succeeded."""
    mean_reward: float
    """Mean episode reward; for a role, that role's mean reward."""
    mean_turns: float
    """Model replies per episode (scripted partners' replies not counted)."""
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    """Multi-role tasks: mean of each `MultiRoleEnv.metrics` entry over the episodes that have it."""
    role: str | None = None
    """The role measured (`task.role` sources), else None."""
    metric: float | None = None
    """For a role: the mean of its own metric (`TaskSpec.role_metrics`), else None."""


def parse_assistant_text(text: str) -> Message:
    """Generated text -> an OpenAI assistant message, with `<tool_call>` JSON blocks as tool calls.
    A block that is not a JSON object with a string `name` makes the whole reply plain content, as
    Qwen's (hermes) tool parser does: the environment then sees a malformed answer, not a call."""
    plain: Message = {"role": "assistant", "content": text}
    calls: list[dict[str, Any]] = []
    for i, raw in enumerate(_TOOL_CALL_RE.findall(text)):
        try:
            call = json.loads(raw)
        except json.JSONDecodeError:
            return plain
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return plain
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):  # OpenAI's wire form is a JSON string
            arguments = json.dumps(arguments)
        function = {"name": call["name"], "arguments": arguments}
        calls.append({"id": f"call_{i}", "type": "function", "function": function})
    if not calls:
        return plain
    content = _TOOL_CALL_RE.sub("", text).strip()
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


@torch.no_grad()
def evaluate_offline(
    model_dir: str | Path,
    task: str,
    n: int = 64,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 32,
) -> EvalResult:
    """Play `n` episodes of `task`'s eval set (episode i plays instance i, cycled) against the model
    at `model_dir`, `batch_size` episodes in lockstep, sampling the full distribution at `temperature`.
    `task` may be `<task>.<role>`: the model plays that role, the others play correct scripted
    replies. Same seed, same machine: same result."""
    name, _, role = task.partition(".")
    spec = get_task(name)
    if spec.roles:
        if role not in spec.roles:
            valid = ", ".join(f"{name}.{r}" for r in spec.roles)
            raise ValueError(f"{task!r}: evaluate one role of a multi-role task: {valid} (or evaluate_team)")
        return evaluate_team({role: model_dir}, name, n, seed, temperature, max_new_tokens, batch_size)
    if role:
        raise ValueError(f"{task!r}: {name} is a single-agent task, it has no roles")
    started = time.monotonic()
    tokenizer, model = _load(model_dir)
    torch.manual_seed(seed)
    played: list[Any] = []
    for batch in _batches(spec, n, batch_size):
        envs = [spec.make_env(instance) for instance in batch]
        histories = [env.reset() for env in envs]
        active = list(range(len(envs)))
        while active:
            chats = [(histories[i], spec.tools) for i in active]
            replies = _generate(model, tokenizer, chats, temperature, max_new_tokens)
            still = []
            for i, text in zip(active, replies, strict=True):
                reply = parse_assistant_text(text)
                histories[i].append(reply)
                step = envs[i].step(reply)
                histories[i] += step.messages
                if not step.done:
                    still.append(i)
            active = still
        for env in envs:
            if hasattr(env, "settle"):  # a dataset task's reward function (sync or async)
                asyncio.run(env.settle())
        played += envs
    return _result(task, [e.success for e in played], [e.reward for e in played],
                   [getattr(e, "turns", 0) for e in played], started)  # fmt: skip


@torch.no_grad()
def evaluate_team(
    models: Mapping[str, str | Path],
    task: str,
    n: int = 64,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 32,
) -> EvalResult:
    """Play a multi-role task, role `r` played by the model at `models[r]` (roles left out play
    correct scripted replies); `mean_reward` is the mean over the roles that acted of their rewards."""
    spec = get_task(task)
    unknown = set(models) - set(spec.roles)
    if not spec.roles or unknown:
        raise ValueError(f"{task!r} roles are {list(spec.roles)}; got models for {sorted(models)}")
    started = time.monotonic()
    dirs = {role: Path(d) for role, d in models.items()}
    oracle = spec.role_oracle
    if oracle is None and set(dirs) != set(spec.roles):
        raise ValueError(
            f"{spec.name} has no role_oracle to script roles {sorted(set(spec.roles) - set(dirs))}"
        )
    loaded = {d: _load(d) for d in set(dirs.values())}  # one copy of a model playing several roles
    torch.manual_seed(seed)
    successes: list[bool] = []
    rewards: list[float] = []
    turns: list[int] = []
    metrics: dict[str, list[float]] = {}
    for batch in _batches(spec, n, batch_size):
        envs = [spec.make_env(instance) for instance in batch]
        replies = [0] * len(envs)
        while pending := [(i, t) for i, env in enumerate(envs) if (t := env.turn()) is not None]:
            # In the task's role order, not a set's: sampling must consume the torch rng the same way every run.
            for role in [r for r in spec.roles if any(t.role == r for _, t in pending)]:
                mine = [(i, t) for i, t in pending if t.role == role]
                if role not in dirs:
                    assert oracle is not None
                    for i, t in mine:
                        envs[i].step(oracle(batch[i], t))
                    continue
                tokenizer, model = loaded[dirs[role]]
                chats = [(t.messages, t.tools) for _, t in mine]
                texts = _generate(model, tokenizer, chats, temperature, max_new_tokens)
                for (i, _), text in zip(mine, texts, strict=True):
                    envs[i].step(parse_assistant_text(text))
                    replies[i] += 1
        for env, count in zip(envs, replies, strict=True):
            successes.append(env.success)
            acted = [env.rewards[r] for r in dirs if r in env.rewards]
            rewards.append(_mean(acted) if acted else 0.0)
            turns.append(count)
            for key, value in env.metrics.items():
                metrics.setdefault(key, []).append(value)
    means = {key: _mean(v) for key, v in metrics.items()}
    role = next(iter(dirs)) if len(dirs) == 1 else None
    return _result(
        f"{spec.name}.{role}" if role else spec.name, successes, rewards, turns, started,
        metrics=means, role=role, metric=means.get(spec.role_metrics.get(role, ""), 0.0) if role else None,
    )  # fmt: skip


def _result(
    task: str, successes: list[bool], rewards: list[float], turns: list[int], started: float, **roles: Any
) -> EvalResult:
    return EvalResult(
        task=task,
        episodes=len(successes),
        success_rate=_mean(successes),
        mean_reward=_mean(rewards),
        mean_turns=_mean(turns),
        seconds=round(time.monotonic() - started, 2),
        **roles,
    )


def _batches(spec: TaskSpec, n: int, batch_size: int) -> list[list[Any]]:
    """The eval instances of `n` episodes (cycled), `batch_size` at a time."""
    instances = spec.eval_tasks()
    played = [instances[i % len(instances)] for i in range(n)]
    return [played[start : start + batch_size] for start in range(0, n, batch_size)]


def _mean(values: list[float] | list[bool] | list[int]) -> float:
    return sum(values) / len(values)


def _load(model_dir: str | Path) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.eval()
    return tokenizer, model


def _generate(
    model: Any,
    tokenizer: Any,
    chats: list[tuple[list[Message], list[dict[str, Any]] | None]],
    temperature: float,
    max_new_tokens: int,
) -> list[str]:
    """One sampled reply per (messages, tools) conversation, in one batched `generate`."""
    prompts = [
        str(tokenizer.apply_chat_template(m, tools=tools, add_generation_prompt=True, tokenize=False))
        for m, tools in chats
    ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **batch,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    texts = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        if tokenizer.eos_token_id in row:  # the reply ends at eos; later ids are padding
            row = row[: row.index(tokenizer.eos_token_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=False))
    return texts
