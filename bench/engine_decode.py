"""One decode step of the embedded engine's KV cache against transformers' own, side by side.

    python bench/engine_decode.py [--steps 60] [--rounds 3] [--threads 1] [--out bench/results]

The embedded engine decodes over a cache of `RoomyLayer`s (`services/engine/kv_batch.py`): each
layer's keys and values live in buffers with spare columns, and a step writes its token in place.
transformers' `DynamicCache` concatenates instead, copying every layer's whole cache at every step.
Both are driven here exactly as the engine drives them (prefill a batch of prompts, then greedy
decode steps of one token per row, the mask grown by a column each step) on two models built here:
the bootstrap `tiny` (Qwen2, 1.8M parameters, random init) and a 100M-parameter Qwen2 of the shape
`bench/weight_sync.py` uses. For each model, batch size and prompt length the two caches alternate,
`--rounds` times each, and the figure is the median time of a decode step over `--steps` steps
(the first `WARMUP` of each run left out). The two caches must produce the same logits; the run stops if
they do not. Writes `engine-decode.{json,md}` with the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from benchutil import RESULTS, machine, write_json
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import Cache
from weight_sync import make_models

from swarmrl.machine import describe
from swarmrl.services.engine.kv_batch import cache_argument, new_cache

CACHES: dict[str, Callable[[], Cache]] = {
    "DynamicCache (concatenates)": DynamicCache,
    "RoomyLayer (in place)": new_cache,
}
WARMUP = 5
"""Decode steps of each run left out of its median (allocator and cache warm-up)."""
SHAPES = {"tiny": [(1, 200), (16, 200), (16, 800), (32, 200)], "qwen2-100m": [(1, 200), (4, 200)]}


@torch.inference_mode()
def decode(
    model: torch.nn.Module, make: Callable[[], Cache], batch: int, prompt: int, steps: int
) -> tuple[float, torch.Tensor]:
    """Median seconds of a decode step after a prefill of `batch` prompts of `prompt` tokens, and
    the last step's logits."""
    arg, gen = cache_argument(model), torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (batch, prompt), generator=gen)
    mask = torch.ones(batch, prompt, dtype=torch.long)
    cache = make()
    out = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(prompt)[None].expand(batch, -1),
                use_cache=True, logits_to_keep=1, **{arg: cache})  # fmt: skip
    times = []
    for n in range(steps):
        t0 = time.perf_counter()
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        out = model(input_ids=token, attention_mask=mask, position_ids=torch.full((batch, 1), prompt + n),
                    use_cache=True, **{arg: cache})  # fmt: skip
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:]), out.logits[:, -1]


def measure(name: str, path: Path, steps: int, rounds: int) -> list[dict[str, Any]]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    for batch, prompt in SHAPES[name]:
        times: dict[str, list[float]] = {kind: [] for kind in CACHES}
        logits: dict[str, torch.Tensor] = {}
        for _ in range(rounds):
            for kind, make in CACHES.items():
                step_s, logits[kind] = decode(model, make, batch, prompt, steps)
                times[kind].append(step_s)
        a, b = logits.values()
        if not torch.allclose(a, b, atol=1e-4, rtol=1e-4):
            raise SystemExit(f"{name} batch {batch} prompt {prompt}: the caches' logits differ")
        medians = {kind: statistics.median(t) for kind, t in times.items()}
        rows.append({"model": name, "batch": batch, "prompt": prompt, "step_s": medians})
        print(
            f"{name} batch {batch} prompt {prompt}: "
            + ", ".join(f"{k} {1000 * v:.2f} ms" for k, v in medians.items()),
            file=sys.stderr,
        )
    return rows


def write_md(result: dict[str, Any], out: Path) -> Path:
    old, new = CACHES
    lines = [
        "# A decode step over the embedded engine's cache (in place) and transformers' DynamicCache (concatenating)",
        "",
        f"Machine: {describe(result['machine'])}; {result['machine']['date']}. Command: `python bench/engine_decode.py "
        f"--steps {result['steps']} --rounds {result['rounds']} --threads {result['threads']}`.",
        "",
        "A prefill of `batch` random prompts of `prompt` tokens, then greedy decode steps of one token a row, as "
        f"the engine runs them; the median step of {result['steps'] - WARMUP} steps (the first {WARMUP} left out), the median "
        f"of {result['rounds']} runs of each cache, the two alternating. Both caches gave the same logits.",
        "",
        f"| model | batch | prompt | {old} | {new} | speed-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        a, b = r["step_s"][old], r["step_s"][new]
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['prompt']} | {1000 * a:.2f} ms | {1000 * b:.2f} ms | {a / b:.2f}x |"
        )
    path = out / "engine-decode.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="decode steps a run")
    p.add_argument("--rounds", type=int, default=3, help="runs of each cache, alternating")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the swarm's engine on 2 cores: 1)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine-decode-") as tmp:
        for name, path in make_models(Path(tmp)).items():  # the models bench/weight_sync.py measures
            rows += measure(name, path, args.steps, args.rounds)
    result = {
        "machine": machine(),
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": args.threads,
        "rows": rows,
    }
    write_json("engine-decode", result, args.out)
    print(f"wrote {write_md(result, args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
