"""Engine throughput: generated tokens per second at several concurrencies, through the HTTP API.

Consumes: an engine behind `EngineClient` (embedded or SGLang). Publishes nothing; returns numbers
for the benchmark suite (`just bench`), which records them with the machine they ran on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from swarmrl.services.engine.client import EngineClient


async def measure_throughput(
    client: EngineClient,
    prompt_len: int,
    new_tokens: int,
    batch_sizes: Sequence[int] = (1, 16),
    *,
    vocab_low: int = 10,
    vocab_high: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Send `batch` concurrent /generate requests per batch size and time them.

    Every request has a random prompt of `prompt_len` token ids drawn from [vocab_low, vocab_high)
    (pick a range valid for the model) and generates exactly `new_tokens` tokens (ignore_eos,
    temperature 1). One warm-up request runs first so loading and first-call costs are not timed.

    Returns:
        `{"prompt_len", "new_tokens", "tokens_per_s": {batch: tokens/s}, "results": [{"batch",
        "seconds", "tokens", "tokens_per_s", "requests_per_s"}, ...]}`, one entry per batch size.
    """
    rng = random.Random(seed)
    params = {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True}

    def prompt() -> list[int]:
        return [rng.randrange(vocab_low, vocab_high) for _ in range(prompt_len)]

    await client.generate(prompt(), {**params, "max_new_tokens": 2}, return_logprob=False)
    results = []
    for batch in batch_sizes:
        started = time.perf_counter()
        outs = await asyncio.gather(*(client.generate(prompt(), params) for _ in range(batch)))
        seconds = time.perf_counter() - started
        tokens = sum(len(o.output_ids) for o in outs)
        results.append({
            "batch": batch,
            "seconds": round(seconds, 4),
            "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 2),
            "requests_per_s": round(batch / seconds, 3),
        })  # fmt: skip
    return {
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "tokens_per_s": {r["batch"]: r["tokens_per_s"] for r in results},
        "results": results,
    }
