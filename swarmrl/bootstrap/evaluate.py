"""Offline evaluation: play a task's held-out eval set with plain `model.generate` sampling, no
swarm services involved. Works on any HF chat model directory that uses Qwen-style `<tool_call>`
tags (the tiny model, Qwen2.5-Instruct); used to measure the warm start and, later, RL progress.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.agents.tasks import get_task
from swarmrl.agents.tasks.base import Message

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class EvalResult:
    """Outcome of `evaluate_offline`."""

    task: str
    episodes: int
    success_rate: float
    mean_reward: float
    mean_turns: float
    seconds: float


def parse_assistant_text(text: str) -> Message:
    """Generated text -> an OpenAI assistant message, with `<tool_call>` JSON blocks as tool calls.

    A block that is not a JSON object with a string `name` makes the whole reply plain content,
    as Qwen's (hermes) tool parser does: the environment then sees a malformed answer, not a call.
    """
    calls: list[dict[str, Any]] = []
    for i, raw in enumerate(_TOOL_CALL_RE.findall(text)):
        try:
            call = json.loads(raw)
        except json.JSONDecodeError:
            return {"role": "assistant", "content": text}
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return {"role": "assistant", "content": text}
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):  # OpenAI's wire form is a JSON string
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        )
    if not calls:
        return {"role": "assistant", "content": text}
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
    """Play `n` episodes of `task`'s eval set (cycled) against the model at `model_dir`.

    Args:
        model_dir: any HF causal-LM directory with a chat template.
        task: a name in `swarmrl.agents.tasks.TASKS`.
        n: number of episodes; episode i plays eval instance i % len(eval set).
        seed: torch seed for sampling (same seed, same machine: same result).
        temperature: sampling temperature (full distribution: no top-k / top-p).
        max_new_tokens: cap per model reply.
        batch_size: episodes played in lockstep, one batched `generate` per turn.

    Returns:
        Success rate, mean reward and mean number of model replies per episode.
    """
    started = time.monotonic()
    spec = get_task(task)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.eval()
    torch.manual_seed(seed)
    instances = spec.eval_tasks()
    rewards: list[float] = []
    successes: list[bool] = []
    turns: list[int] = []
    for start in range(0, n, batch_size):
        envs = [
            spec.make_env(instances[i % len(instances)]) for i in range(start, min(n, start + batch_size))
        ]
        histories = [env.reset() for env in envs]
        active = list(range(len(envs)))
        while active:
            prompts = [
                str(
                    tokenizer.apply_chat_template(
                        histories[i], tools=spec.tools, add_generation_prompt=True, tokenize=False
                    )
                )
                for i in active
            ]
            replies = _generate(model, tokenizer, prompts, temperature, max_new_tokens)
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
            rewards.append(env.reward)
            successes.append(env.success)
            turns.append(getattr(env, "turns", 0))
    return EvalResult(
        task=task,
        episodes=len(rewards),
        success_rate=sum(successes) / len(successes),
        mean_reward=sum(rewards) / len(rewards),
        mean_turns=sum(turns) / len(turns),
        seconds=round(time.monotonic() - started, 2),
    )


def _generate(
    model: Any, tokenizer: Any, prompts: list[str], temperature: float, max_new_tokens: int
) -> list[str]:
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
