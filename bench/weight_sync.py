"""Bytes and time of one weight update, trainer to engine: full fp32, full bf16 and LoRA adapter only.

    python bench/weight_sync.py [--rounds 3] [--rank 16] [--out bench/results]

What a weight update costs in a swarm: the trainer writes a version (`save_pretrained`: the files an
engine loads; the optimizer state it also keeps is not shipped), then the engine loads it between
batches (`update_weights_from_disk` into the running embedded engine, or `load_lora_adapter` of an
adapter into peft's wrapper of the base). Measured on two models built here from their configs: the
bootstrap `tiny` (Qwen2, 1.8M parameters) and a 100M-parameter Qwen2 (random init, same shape family);
LoRA of rank `--rank` on every linear layer. Each figure is the median of `--rounds`, on an otherwise
idle machine with 2 torch threads. Writes `weight-sync.{json,md}`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchutil import RESULTS, machine, write_json
from transformers import AutoModelForCausalLM, Qwen2Config

from swarmrl.machine import describe
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import load_trainable

BIG = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                  tie_word_embeddings=True)  # fmt: skip
"""100M parameters (embeddings tied with the head): a shape like Qwen2.5-0.5B's, smaller."""


def make_models(root: Path) -> dict[str, Path]:
    from swarmrl.bootstrap import build_model

    tiny = root / "tiny"
    build_model(tiny, seed=0, warm_start_steps=0)
    big = root / "qwen2-100m"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(BIG).save_pretrained(big)
    return {"tiny": tiny, "qwen2-100m": big}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".safetensors", ".json"))


def _median_s(fn: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, base: Path, work: Path, rank: int, rounds: int) -> list[dict[str, Any]]:
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for fmt, dtype in (("full fp32", torch.float32), ("full bf16", torch.bfloat16)):
        out = work / f"{name}-{fmt.replace(' ', '-')}"

        def save(out: Path = out, dtype: torch.dtype = dtype) -> None:
            shutil.rmtree(out, ignore_errors=True)
            cast: dict[int, torch.Tensor] = {}  # tied tensors (embeddings and head) stay one tensor
            state = {k: cast.setdefault(v.data_ptr(), v.to(dtype)) for k, v in model.state_dict().items()}
            model.save_pretrained(out, state_dict=state)

        save_s = _median_s(save, rounds)
        engine = EngineCore(base, max_batch=4)
        try:
            load_s = _median_s(
                lambda out=out, engine=engine: _ok(engine.update_weights_from_disk(str(out))), rounds
            )
        finally:
            engine.close()
        rows.append({"model": name, "params": params, "format": fmt, "bytes": _size(out), "save_s": save_s,
                     "load_s": load_s})  # fmt: skip
    lora = load_trainable(TrainerConfig(model_path=str(base), lora_rank=rank), base)  # as the trainer does
    with torch.no_grad():  # a trained adapter's B is not 0
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    out = work / f"{name}-adapter"

    def save_adapter() -> None:
        shutil.rmtree(out, ignore_errors=True)
        lora.save_pretrained(out)

    save_s = _median_s(save_adapter, rounds)
    engine = EngineCore(base, max_batch=4, adapters=["policy"])
    try:
        load_s = _median_s(lambda: _ok(engine.load_lora_adapter("policy", str(out))), rounds)
    finally:
        engine.close()
    rows.append({"model": name, "params": params, "format": f"LoRA r{rank} adapter", "bytes": _size(out),
                 "save_s": save_s, "load_s": load_s, "trainable": trainable})  # fmt: skip
    return rows


def _ok(result: tuple[bool, str]) -> None:
    ok, message = result
    if not ok:
        raise RuntimeError(message)


def write_md(result: dict[str, Any], out: Path) -> Path:
    lines = [
        "# One weight update, trainer to engine: full fp32, full bf16, LoRA adapter only",
        "",
        f"Machine: {describe(result['machine'])}; {result['machine']['date']}. Command: `python bench/weight_sync.py --rounds {result['rounds']} "
        f"--rank {result['rank']}`; medians of {result['rounds']} rounds.",
        "",
        "`bytes`: the files the trainer writes for an engine (safetensors and JSON; the optimizer state it "
        "keeps is not shipped). `save`: `save_pretrained` of them. `load`: the running embedded engine "
        "loading them (`update_weights_from_disk`; an adapter: `load_lora_adapter` into peft's wrapper of "
        "the base). An adapter also needs the base once, when the engine starts, and its first load wraps that base "
        "in peft's model (once per engine, a few times a reload's cost): the median of 3 or more rounds is an in-place reload's.",
        "",
        "| model | parameters | format | bytes | vs fp32 | save | load | save + load |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        full = next(x for x in result["rows"] if x["model"] == r["model"] and x["format"] == "full fp32")
        fmt = r["format"] + (f" ({r['trainable'] / 1e6:.2f}M trained)" if "trainable" in r else "")
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.1f}M | {fmt} | {r['bytes'] / 2**20:.2f} MiB | "
            f"{full['bytes'] / r['bytes']:.1f}x fewer | {1000 * r['save_s']:.0f} ms | {1000 * r['load_s']:.0f} ms | "
            f"{1000 * (r['save_s'] + r['load_s']):.0f} ms |"
        )
    big = [r for r in result["rows"] if r["model"] == result["rows"][-1]["model"]]
    total = {r["format"].split(" (")[0]: r["save_s"] + r["load_s"] for r in big}
    full, bf16, lora = (total[k] for k in ("full fp32", "full bf16", f"LoRA r{result['rank']} adapter"))
    lines += [
        "",
        f"On {big[0]['model']}, the adapter is {big[0]['bytes'] / big[-1]['bytes']:.0f}x fewer bytes and "
        f"{full / lora:.1f}x faster end to end than full fp32; full bf16 halves the bytes but takes "
        f"{bf16 / full:.1f}x the time on this CPU (a cast on each side: the trainer's fp32 to bf16, then "
        "bf16 to the engine's fp32). On the tiny model every update is tens of milliseconds, and peft's "
        "fixed costs (adapter config, model card) make the adapter the slowest of the three.",
    ]
    path = out / "weight-sync.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rank", type=int, default=16, help="LoRA rank")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="weight-sync-") as tmp:
        work = Path(tmp)
        rows = []
        for name, base in make_models(work / "models").items():
            rows += measure(name, base, work, args.rank, args.rounds)
            print(f"{name}: done", file=sys.stderr)
    result = {"machine": machine(), "rounds": args.rounds, "rank": args.rank, "rows": rows}
    write_json("weight-sync", result, args.out)
    print(f"wrote {write_md(result, args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
