"""The SFT warm start: small steps on synthetic demonstrations of the model's sources, loss on
assistant tokens only, so the tiny model starts RL with the right formats and a weak strategy.

Episodes are tokenized the way the gateway sees them at RL time: each prompt is the chat template
rendered with a generation prompt, each reply is content + `<|im_end|>` appended as generated ids
(which relies on the template's prefix stability).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarmrl.agents.tasks import TASKS
from swarmrl.agents.tasks.base import Message
from swarmrl.bootstrap.presets import DEFAULT_PRESET, get_preset, parse_source, sft_weight
from swarmrl.services.engine.kv_batch import cache_argument

Demonstrate = Callable[[Any, random.Random], list[Message]]


def encode_episode(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of an episode and its loss mask (1 on tokens the model generates), up to the end of
    its last assistant message."""

    def render(upto: int, generation_prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            messages[:upto], tools=cast(Any, tools), add_generation_prompt=generation_prompt, tokenize=False
        )
        assert isinstance(text, str)  # tokenize=False always renders text
        return text

    ids: list[int] = []
    mask: list[int] = []
    done = ""  # the text already turned into ids
    eos = tokenizer.eos_token
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(i, True)
        full = render(i + 1, False)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            raise ValueError(f"chat template is not prefix-stable at message {i}: {message!r}")
        reply = full[len(prompt) :]
        reply = reply[: reply.index(eos) + len(eos)]
        prompt_ids = tokenizer.encode(prompt[len(done) :], add_special_tokens=False)
        reply_ids = tokenizer.encode(reply, add_special_tokens=False)
        ids += prompt_ids + reply_ids
        mask += [0] * len(prompt_ids) + [1] * len(reply_ids)
        done = prompt + reply
    return ids, mask


def source_demonstration(source: str) -> tuple[Demonstrate, list[dict[str, Any]] | None]:
    """What an SFT source demonstrates: (instance, rng) -> messages, and the tool specs they go with.
    A `<task>.<role>` source gives that role's conversations from the task's `role_demonstrations`."""
    task, role = parse_source(source)
    spec = TASKS[task]
    if role is None:
        if spec.demonstration is None:
            raise ValueError(
                f"task {task!r} has no demonstrations to warm-start from (a dataset task needs its answer column: "
                f'answer = "<column>")'
            )
        return spec.demonstration, spec.tools
    role_demonstrations = spec.role_demonstrations
    assert role_demonstrations is not None  # TaskSpec refuses a multi-role task without them
    return (lambda instance, rng: role_demonstrations(instance, rng)[role]), spec.role_tools.get(role)


def demonstration_batches(
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    seed: int,
    sources: list[str] | None = None,
) -> Callable[[], dict[str, torch.Tensor]]:
    """A function returning the next batch: one source (and view of it) per batch, in turn, each
    source `presets.sft_weight(source)` times per round; `sources` (default: the `tiny` preset's),
    in their order, and `seed` fix the stream. A batch is `prefix_ids` [1, P], the token prefix all
    its episodes share (`sft_loss` runs it once), and `input_ids` / `labels` [B, S] for the rest."""
    rng = random.Random(seed)
    names = list(sources or get_preset(DEFAULT_PRESET).sources)
    specs = {name: TASKS[parse_source(name)[0]] for name in names}
    streams = {name: (spec.sft_tasks or spec.train_tasks)(seed) for name, spec in specs.items()}
    demos = {name: source_demonstration(name) for name in names}
    # Tool sources are also shown without the tool specs: those long contexts dilute the attention a
    # tiny model needs to learn copying, and offsets learned in short contexts carry over (RoPE).
    views: list[tuple[str, list[dict[str, Any]] | None]] = []
    for name in names:
        tools = demos[name][1]
        one = [(name, tools)] + ([(name, None)] if tools else [])
        views += one * sft_weight(name)
    turns = itertools.cycle(views)

    def next_batch() -> dict[str, torch.Tensor]:
        name, tools = next(turns)
        demonstrate = demos[name][0]
        rows = [
            encode_episode(tokenizer, demonstrate(next(streams[name]), rng), tools) for _ in range(batch_size)
        ]
        # Labels are shifted inside the model, so the suffix's first token is only an input: every
        # trained token must come after it.
        first_trained = min(mask.index(1) if 1 in mask else len(mask) for _, mask in rows)
        common = len(os.path.commonprefix([ids for ids, _ in rows]))
        shared = max(0, min(common, first_trained) - 1)
        width = max(len(ids) for ids, _ in rows) - shared
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for r, (ids, mask) in enumerate(rows):
            # Right padding needs no attention mask: causal attention never looks right.
            rest = ids[shared:]
            input_ids[r, : len(rest)] = torch.tensor(rest)
            labels[r, : len(rest)] = torch.tensor(
                [t if m else -100 for t, m in zip(rest, mask[shared:], strict=True)]
            )
        return {
            "prefix_ids": torch.tensor([rows[0][0][:shared]], dtype=torch.long),
            "input_ids": input_ids,
            "labels": labels,
        }

    return next_batch


def sft_loss(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy on the labelled tokens; the shared prefix is run once and its KV cache
    repeated over the batch (gradients flow through it, so this equals the full-sequence loss)."""
    name = cache_argument(model)  # `cache` in the transformers that deprecate `past_key_values`
    cache = None
    if batch["prefix_ids"].shape[1] > 0:
        cache = getattr(model(input_ids=batch["prefix_ids"], use_cache=True), name)  # the output's field too
        cache.batch_repeat_interleave(batch["input_ids"].shape[0])
    # Labels are shifted inside the model; -100 masks prompts, environment replies and padding.
    return model(input_ids=batch["input_ids"], labels=batch["labels"], **{name: cache}).loss


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    steps: int,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
    sources: list[str] | None = None,
) -> list[float]:
    """Run `steps` AdamW steps (linear warmup, cosine decay) on demonstrations of `sources`; returns
    the losses."""
    if steps <= 0:
        return []
    next_batch = demonstration_batches(tokenizer, batch_size, seed, sources)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses: list[float] = []
    model.train()
    with _progress(progress, steps) as advance:
        for _ in range(steps):
            loss = sft_loss(model, next_batch())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            advance(losses[-1])
    model.eval()
    return losses


@contextlib.contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[float], None]]:
    """A rich progress bar over SFT steps, or nothing when disabled (tests, logs)."""
    if not enabled:
        yield lambda loss: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("SFT warm start"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns) as bar:
        task = bar.add_task("sft", total=total, loss=float("nan"))
        yield lambda loss: bar.update(task, advance=1, loss=loss)
