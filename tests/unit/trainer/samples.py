"""Synthetic `Sample` records for trainer tests (unit and integration), and a setting that breaks
the weights."""

from __future__ import annotations

import random
import zlib

from swarmrl.schemas import Sample

OVERFLOWING_ADAMW = {"lr": 1e37, "weight_decay": 34.0}
"""Trainer settings whose first AdamW step leaves weights at ±inf from a finite loss and gradients:
decay multiplies the norm weights (1.0) by 1 - lr * wd = -3.4e38, and the update pushes some of them
past float32's max."""


def make_sample(
    episode: str,
    reward: float,
    *,
    group: str = "g",
    prompt: int = 4,
    gen: int = 4,
    version: int = 0,
    agent: str = "a",
    index: int = 0,
    n_samples: int = 1,
    model: str = "tiny",
    vocab: int = 50,
    seed: int | None = None,
    logprob: float = -1.0,
    task: str = "",
    group_size: int = 0,
) -> Sample:
    """A prompt of `prompt` tokens then `gen` generated ones (loss_mask 1, behaviour logprob `logprob`)."""
    rng = random.Random(seed if seed is not None else zlib.crc32(f"{episode}.{agent}.{index}".encode()))
    n = prompt + gen
    return Sample(
        sample_id=f"{episode}.{agent}.{model}.{index}",
        model=model,
        episode_id=episode,
        agent=agent,
        task_id=group,
        group_key=group,
        group_size=group_size,
        task=task,
        token_ids=[rng.randrange(3, vocab) for _ in range(n)],
        loss_mask=[0] * prompt + [1] * gen,
        logprobs=[0.0] * prompt + [logprob] * gen,
        policy_versions=[-1] * prompt + [version] * gen,
        reward=reward,
        index=index,
        n_samples=n_samples,
    )
