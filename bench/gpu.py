"""Generate and train throughput on a GPU, for a ~0.5B-parameter model built offline.

    python bench/gpu.py [--device cuda] [--layers 24] [--out bench/results]

The model has Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads with 2 KV heads, MLP 4864,
vocabulary 151,936, tied embeddings: 494M parameters), random initialisation, saved as bf16
safetensors without a tokenizer: token ids in, token ids out, so no hub download is needed.

Generate: the embedded engine (`EngineCore` in this process, bf16) answers N concurrent requests,
each a random 128-token prompt generating exactly 128 tokens (temperature 1, ignore_eos), for N in
1, 16 and 64, twice (the first pass meets each batch size and length for the first time):
generated tokens/s. Then time to first token of one request (median of 5), and a
weight update from disk (a trainer checkpoint of the same model; median of 3).

Train: the learner (fp32 weights, bf16 autocast, AdamW) takes GRPO steps over 4 groups of 8 answers
(a 256-token prompt, 256-token answers): trained tokens/s and peak GPU memory, with prefix sharing
(each prompt computed once) and packed (each sample whole), then a rank-16 LoRA adapter with prefix
sharing; each layout's first step is a warm-up, the median of the next 3 is reported. Each layout
also saves what it would ship to the engines per version (a full bf16 checkpoint, or the adapter):
bytes and seconds.

Writes gpu.{json,md}; `--out` defaults to bench/results.
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json

PROMPT, NEW = 128, 128
CONCURRENCY = (1, 16, 64)
GROUPS, ANSWERS, TRAIN_PROMPT, TRAIN_ANSWER = 4, 8, 256, 256
VOCAB_IDS = 700
"""Prompt and answer ids are drawn below this: valid for any `--vocab` (a random-init model's speed
does not depend on which ids it reads)."""
LAYOUTS = {
    "full, prefix-shared": (True, 0),
    "full, packed": (False, 0),
    "LoRA r16, prefix-shared": (True, 16),
}


def build(out: Path, layers: int, vocab: int) -> dict[str, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, eos_token_id=vocab - 1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers types .to() oddly
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "layers": layers, "vocab": vocab, "dtype": "bfloat16"}


def generate(model: Path, checkpoint: Path, device: str) -> dict[str, Any]:
    from swarmrl.services.engine.engine_core import EngineCore
    from swarmrl.services.engine.sampling import SamplingParams

    rng = random.Random(0)
    engine = EngineCore(model, max_batch=max(CONCURRENCY), device=device, dtype="bfloat16")

    def prompt() -> list[int]:
        return [rng.randrange(10, VOCAB_IDS) for _ in range(PROMPT)]

    sp = SamplingParams(max_new_tokens=NEW, temperature=1.0, ignore_eos=True)
    try:
        engine.submit(prompt(), SamplingParams(max_new_tokens=4, ignore_eos=True)).result(300)  # warm-up
        rows = []
        for round_ in (1, 2):  # the first pass meets every batch size and length for the first time
            for n in CONCURRENCY:
                started = time.perf_counter()
                futures = [engine.submit(prompt(), sp) for _ in range(n)]
                wait(futures, timeout=600)
                seconds = time.perf_counter() - started
                tokens = sum(len(f.result().output_ids) for f in futures)
                rows.append({"pass": round_, "concurrent": n, "seconds": round(seconds, 3), "tokens": tokens,
                             "tokens_per_s": round(tokens / seconds, 1)})  # fmt: skip
                print(f"generate x{n}: {rows[-1]}", file=sys.stderr, flush=True)
        first = []
        for _ in range(5):
            started = time.perf_counter()
            engine.submit(prompt(), SamplingParams(max_new_tokens=1, ignore_eos=True)).result(60)
            first.append(time.perf_counter() - started)
        updates = []
        for v in range(3):
            started = time.perf_counter()
            ok, message = engine.update_weights_from_disk(str(checkpoint), str(10 + v))
            assert ok, message
            updates.append(time.perf_counter() - started)
        return {"rows": rows, "ttft_s": round(statistics.median(first), 4),
                "weight_update_s": round(statistics.median(updates), 3), "engine": engine.stats()["prefill"]}  # fmt: skip
    finally:
        engine.close()


def items(seed: int) -> list[Any]:
    from swarmrl.schemas import Sample
    from swarmrl.services.trainer.batching import Scored

    rng = random.Random(seed)
    out = []
    for g in range(GROUPS):
        prompt = [rng.randrange(10, VOCAB_IDS) for _ in range(TRAIN_PROMPT)]
        for a in range(ANSWERS):
            answer = [rng.randrange(10, VOCAB_IDS) for _ in range(TRAIN_ANSWER)]
            ids = prompt + answer
            out.append(Scored(Sample(
                sample_id=f"s{seed}-{g}-{a}", model="m", episode_id=f"e{seed}-{g}-{a}", agent="a", task_id="t",
                group_key=f"g{seed}-{g}", token_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(answer),
                logprobs=[-12.0] * len(ids), policy_versions=[0] * len(ids), reward=float(a % 2),
            ), 1.0 if a % 2 else -1.0))  # fmt: skip
    return out


def train(model: Path, tmp: Path) -> dict[str, Any]:
    import torch

    from swarmrl.services.trainer.checkpoint import TrainerState
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {}
    for name, (shared, rank) in LAYOUTS.items():
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        cfg = TrainerConfig(
            model_path=str(model), run_dir=str(tmp / "run"), lr=1e-5, mixed_precision="bf16",
            max_tokens_per_micro_batch=4096, prefix_sharing=shared, lora_rank=rank,
        )  # fmt: skip
        learner = Learner(cfg, model)
        times, stats = [], []
        for step in range(4):
            batch = items(step)
            sync()
            started = time.perf_counter()
            stats.append(learner.train_step(batch, version=0).stats)
            sync()
            times.append(time.perf_counter() - started)
        ckpt = tmp / f"ckpt-{rank}-{shared}"
        started = time.perf_counter()
        learner.save(ckpt, TrainerState("m", 4, 4))
        save_s = time.perf_counter() - started
        step_s = statistics.median(times[1:])
        trained = stats[-1]["trained_tokens"]
        out[name] = {
            "step_s": round(step_s, 3), "trained_tokens": int(trained), "computed_tokens": int(stats[-1]["computed_tokens"]),
            "sample_tokens": GROUPS * ANSWERS * (TRAIN_PROMPT + TRAIN_ANSWER),
            "sample_tokens_per_s": round(GROUPS * ANSWERS * (TRAIN_PROMPT + TRAIN_ANSWER) / step_s),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "loss_finite": all(s["skipped_updates"] == 0 for s in stats),
            "save_s": round(save_s, 2),
            "save_mib": round(sum(f.stat().st_size for f in ckpt.rglob("*.safetensors")) / 2**20, 1),
        }  # fmt: skip
        print(f"train {name}: {out[name]}", file=sys.stderr, flush=True)
        del learner
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return out


def card(device: str) -> dict[str, Any]:
    import torch

    if torch.device(device).type != "cuda":
        return {"name": f"no GPU ({device})", "memory_gib": 0, "capability": [], "cuda": torch.version.cuda}
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": list(torch.cuda.get_device_capability(index)), "cuda": torch.version.cuda}  # fmt: skip


def markdown(r: dict[str, Any]) -> str:
    c, m, g = r["card"], r["machine"], r["generate"]
    lines = [
        "# GPU throughput: a ~0.5B-parameter model, generate and train",
        "",
        f"{c['name']} ({c['memory_gib']} GiB, CUDA {c['cuda']}), {m['cores']} CPU cores, torch {m['torch']}; "
        f"{m['date']}. Written by `python bench/gpu.py`.",
        "",
        f"Model: Qwen2.5-0.5B's shape, {r['model']['params'] / 1e6:.0f}M parameters ({r['model']['layers']} layers, "
        f"vocabulary {r['model']['vocab']:,}), random initialisation, no tokenizer (token ids in and out).",
        "",
        "## Generate: the embedded engine, bf16",
        "",
        f"Random {PROMPT}-token prompts, {NEW} new tokens each (temperature 1, ignore_eos), all sent at once.",
        "",
        "| concurrent requests | first pass: seconds | tokens/s | second pass: seconds | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {a['concurrent']} | {a['seconds']} | {a['tokens_per_s']:.0f} | {b['seconds']} | {b['tokens_per_s']:.0f} |"
            for a, b in zip(
                [x for x in g["rows"] if x["pass"] == 1], [x for x in g["rows"] if x["pass"] == 2], strict=True
            )
        ),
        "",
        f"Time to first token of one request: {g['ttft_s'] * 1000:.1f} ms. Weight update from disk "
        f"(`update_weights_from_disk`, a bf16 checkpoint of the same model): {g['weight_update_s']:.2f} s. "
        "Where a decode step's time goes (cuDNN's attention plans, the sampler): gpu-attention.md.",
        "",
        "## Train: the learner, fp32 weights with bf16 autocast, AdamW",
        "",
        f"One step: {GROUPS} GRPO groups of {ANSWERS} answers, a {TRAIN_PROMPT}-token prompt and "
        f"{TRAIN_ANSWER}-token answers ({GROUPS * ANSWERS * (TRAIN_PROMPT + TRAIN_ANSWER):,} sample tokens); "
        "median of 3 steps after a warm-up. *computed*: the positions the forward passes hold (a shared "
        "prompt once per group). *update*: what a version ships to the engines (full: the "
        "checkpoint's safetensors as the trainer writes them; LoRA: the adapter); *checkpoint save*: the trainer's whole checkpoint, optimizer state included.",
        "",
        "| layout | step s | sample tokens/s | computed tokens | peak GPU GiB | update MiB | checkpoint save s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {x['step_s']} | {x['sample_tokens_per_s']:,} | {x['computed_tokens']:,} | "
            f"{x['peak_gib']} | {x['save_mib']} | {x['save_s']} |"
            for name, x in r["train"].items()
        ),
        "",
    ]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))  # fmt: skip
    p.add_argument(
        "--device", default="cuda", help="torch device of the engine (the learner uses Accelerate's)"
    )
    p.add_argument("--layers", type=int, default=24, help="decoder layers (24 is Qwen2.5-0.5B's)")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary (151,936 is Qwen2.5's)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where gpu.json and gpu.md go")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, checkpoint = Path(tmp) / "model", Path(tmp) / "checkpoint"
        info = build(model, args.layers, args.vocab)
        shutil.copytree(model, checkpoint)  # a trainer's checkpoint of the same model: the same files
        print(f"model: {info}", file=sys.stderr, flush=True)
        result = {
            "card": card(args.device),
            "model": info,
            "generate": generate(model, checkpoint, args.device),
        }
        result["train"] = train(model, Path(tmp))
    result["machine"] = machine()
    write_json("gpu", result, args.out)
    (args.out / "gpu.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
