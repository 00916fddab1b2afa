"""The peer: TRL's `GRPOTrainer` on swarmrl's `calculator` task, for `bench/peers.py`.

Runs in TRL's own virtual environment (`just trl-env`: `.venv-trl`, with swarmrl installed there
without its dependencies, so that this file imports the task itself), never in the project's: TRL's
pins never constrain swarmrl's. It trains the model directory it is given for `--minutes` of wall
clock counted from `--t0` (when the orchestrator launched this process, as for swarmrl's `up`) and
saves the model every `--save-every` seconds as an HF directory (`ckpt-<step>/`, listed with its
time in `checkpoints.jsonl`), which `bench/peers.py` evaluates with swarmrl's own evaluator.

The same work as swarmrl's `calculator`:
- prompts: the task's system prompt and `What is <expression>?`, from the task's own training stream
  (`train_tasks(seed)`, which skips the held-out set), with the task's one tool;
- the tool: a plain function whose schema (from its type hints and docstring, as TRL requires)
  renders the very prompt tokens the gateway renders from the task's `TOOLS` (checked at start);
- the reward: each completion replayed through the task's own `CalculatorEnv` (three turns at most,
  1 when the final answer is right);
- group size 8 and 32 completions per optimizer step (4 prompts), as swarmrl's trainer defaults
  (`num_repeat = 8`, `batch_groups = 4`, which `bench/peers.py` reads from swarmrl's configuration and
  passes here as `--group-size` and `--batch`; its `--batch` changes both sides alike; swarmrl's
  steps take at most that many, the informative groups ready when its trainer is free);
  sampling temperature 1; the same learning rate, AdamW,
  constant schedule, gradient clipping at 1, no KL term and the clip range 0.2 / 0.28.

Everything else is TRL's default (`loss_type="dapo"`, `scale_rewards="group"`, one iteration per
batch, generation with transformers' `generate`). Three defaults are changed, each away from a
GPU-sized choice that would only slow TRL down here: `bf16=False` (the model is fp32 and swarmrl
trains in fp32; bf16 autocast on these CPUs is slower for it), `gradient_checkpointing=False`
(it trades compute for memory, and this 1.8M-parameter model needs no memory saved) and
`learning_rate` (TRL's 1e-6 is sized for billion-parameter models; 1e-4 is what this model is
trained with).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from swarmrl.agents.tasks import calculator as task

# How our chat template writes an assistant turn (Hermes-style `<tool_call>` JSON, as Qwen2.5's):
# transformers' response template (the format `tokenizer.parse_response` reads), which TRL asks the
# user to set for a chat template it does not know.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def calculator(expression: str):  # noqa: ANN201 - no return hint: it would add "return" to the schema
    """Evaluate an arithmetic expression.

    Args:
        expression: for example 37 * 12 + 5
    """
    return task.CalculatorEnv._run_tool(expression)


def episode_reward(expression: str, completion: list[dict[str, Any]]) -> float:
    """The completion's messages replayed through the task's environment: swarmrl's reward."""
    env = task.CalculatorEnv(task.Calculator(expression))
    env.reset()
    for message in completion:
        if message.get("role") == "assistant" and not env.done:
            env.step(message)
    return env.reward if env.done else 0.0


def reward(completions: list[list[dict[str, Any]]], expression: list[str], **_: Any) -> list[float]:
    return [episode_reward(e, c) for e, c in zip(expression, completions, strict=True)]


def dataset(seed: int, n: int) -> Dataset:
    stream = task.train_tasks(seed)
    rows = []
    for _ in range(n):
        q = next(stream)
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": task.SYSTEM_PROMPT},
                    {"role": "user", "content": q.user_prompt()},
                ],
                "expression": q.expression,
            }
        )
    return Dataset.from_list(rows)


def check_prompt(tokenizer: Any) -> None:
    """The prompt TRL renders (tools as functions) is token for token the gateway's (tools as specs)."""
    messages = [
        {"role": "system", "content": task.SYSTEM_PROMPT},
        {"role": "user", "content": "What is 2 + 3 * 4?"},
    ]
    ours = tokenizer.apply_chat_template(
        messages, tools=task.TOOLS, add_generation_prompt=True, tokenize=False
    )
    theirs = tokenizer.apply_chat_template(
        messages, tools=[calculator], add_generation_prompt=True, tokenize=False
    )
    if ours != theirs:
        raise SystemExit(
            f"the tool function renders another prompt than the task's TOOLS:\n{ours}\n---\n{theirs}"
        )


class Budget(TrainerCallback):
    """Stops training `minutes` after `t0`; saves the model every `every` seconds and at the end."""

    def __init__(self, out: Path, t0: float, minutes: float, every: float, tokenizer: Any) -> None:
        self.out, self.t0, self.budget, self.every, self.tokenizer = out, t0, minutes * 60, every, tokenizer
        self.next_save = 0.0
        self.log = (out / "log.jsonl").open("a")

    def save(self, model: Any, step: int) -> None:
        t = time.time() - self.t0
        path = self.out / f"ckpt-{step}"
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        with (self.out / "checkpoints.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "t": t, "path": str(path)}) + "\n")
        self.next_save = t + self.every

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        self.save(model, 0)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        t = time.time() - self.t0
        if t >= self.budget:
            control.should_training_stop = True
            self.save(model, state.global_step)
        elif t >= self.next_save:
            self.save(model, state.global_step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        row = {"step": state.global_step, "t": time.time() - self.t0, **(logs or {})}
        self.log.write(json.dumps(row) + "\n")
        self.log.flush()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", type=Path, required=True, help="HF model directory (the warm-started bootstrap model)"
    )
    p.add_argument("--out", type=Path, required=True, help="where checkpoints and logs go")
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget from --t0")
    p.add_argument(
        "--t0", type=float, default=0.0, help="epoch seconds the budget counts from (default: now)"
    )
    p.add_argument("--save-every", type=float, default=60.0, help="seconds between saved checkpoints")
    p.add_argument("--batch", type=int, default=32, help="completions per optimizer step (whole groups)")
    p.add_argument("--group-size", type=int, default=8, help="completions of one prompt (num_generations)")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (bench/peers.py passes swarmrl's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args()
    t0 = a.t0 or time.time()
    if a.threads:
        torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    tokenizer.response_template = RESPONSE_TEMPLATE
    check_prompt(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(a.out / "trainer"),
        use_cpu=True,
        seed=a.seed,
        max_steps=1_000_000,  # the budget stops it
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=1,
        num_generations=a.group_size,
        temperature=1.0,
        max_completion_length=3 * 48 + 2 * 16,  # three replies of 48 tokens and two tool results
        max_tool_calling_iterations=2,  # three turns in all, as the task allows
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset(a.seed, 50_000),
        processing_class=tokenizer,
        tools=[calculator],
    )
    trainer.add_callback(Budget(a.out, t0, a.minutes, a.save_every, tokenizer))
    trainer.train()


if __name__ == "__main__":
    main()
