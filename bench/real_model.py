"""A real model on this machine: engine and trainer throughput against its matmul rate, side by side.

    python bench/real_model.py [--model smollm2-135m-instruct] [--threads 2] [--skip-vllm] [--out DIR]

One run, each part in a process of its own (peak resident memory per process; Accelerate's state is
process-wide), one after the other on the same threads:

- GEMM: the best of fp32 and bf16 square matmuls (2048 and 4096): the machine's rate, `gemm_flops`.
- Generation, tokens/s at 1, 16 and 64 rows (64-token prompts, 64 new tokens, temperature 1): the
  embedded engine and vLLM's CPU build, each in fp32 and bf16, as `swarmrl serve engine` runs them
  (HTTP); plain `transformers.generate` (`do_sample=True`, the same prompts and lengths) in fp32,
  the floor, and bf16. Share of the GEMM rate: 2 x parameters x tokens/s / `gemm_flops`.
- Trainer, computed tokens/s of a step of 4 GRPO groups (8 answers of 32 tokens below a shared
  64-token prompt), full weights and a rank-16 LoRA adapter, prefix-shared and packed, fp32 and bf16
  autocast; the median of 3 steps after 2. Share: (6 full, 4 LoRA) x parameters x tokens/s /
  `gemm_flops`.
- Logprobs: the engine's logprobs of 512 sampled tokens against the trainer's of the same tokens,
  mean and max |difference|, for each engine dtype and trainer precision.
- Where the time goes: torch's profiler over a 16-row decode step and a trainer step (top ops).

Writes `real-model.{json,md}` (the JSON keys the issue names: `gemm_flops`, `gemm_flops_fp32`,
`gemm_flops_bf16`, `engines`, `trainer`, plus `logprobs`, `profiles`, `memory_mib`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json

ROWS = (1, 16, 64)
PROMPT_LEN, NEW_TOKENS = 64, 64
GROUPS, ANSWERS, PROMPT, ANSWER = 4, 8, 64, 32
"""A trainer step: GROUPS groups of ANSWERS answers of ANSWER tokens below a shared PROMPT-token prompt."""


# -- parts (each runs in its own process: `--part NAME --spec JSON`) --------------------------------


def part_gemm(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        best = 0.0
        for n in (2048, 4096):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b
            for _ in range(3):
                t = time.perf_counter()
                a @ b
                best = max(best, 2 * n**3 / (time.perf_counter() - t))
        out[name] = best
    return out


def part_generate(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"])).eval()
    out = {}
    for rows in ROWS:
        ids = torch.tensor(_prompts(rows, spec["vocab"]))
        kw = {"attention_mask": torch.ones_like(ids), "do_sample": True, "temperature": 1.0, "top_k": 0}
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
            t = time.perf_counter()
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kw)
            seconds = time.perf_counter() - t
        out[str(rows)] = (gen.shape[1] - ids.shape[1]) * rows / seconds
    return {"tokens_per_s": out, "memory_mib": _self_hwm()}


def part_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """`swarmrl serve engine` in a process of its own, driven over HTTP as a gateway drives it."""
    from engine_throughput import measure_throughput
    from engines import spawn

    from swarmrl.infra.nats_server import free_port
    from swarmrl.services.engine.client import open_engine

    async def run() -> dict[str, Any]:
        port = free_port()
        cmd = [sys.executable, "-m", "swarmrl.cli", "serve", "engine", "--model", "policy", "--model-path",
               spec["model"], "--port", str(port), "--nats", "", "--torch-threads", str(spec["threads"]),
               "--backend", spec["backend"], "--dtype", spec["dtype"], "--max-batch", "64"]  # fmt: skip
        if spec["backend"] == "vllm":
            cmd.append("--vllm-python=" + spec["vllm_python"])
        proc = spawn(cmd, Path(spec["log"]))
        try:
            client = await open_engine(f"http://127.0.0.1:{port}", timeout_s=900)
            res = await measure_throughput(
                client, PROMPT_LEN, NEW_TOKENS, ROWS, vocab_low=100, vocab_high=spec["vocab"] - 100
            )
            await client.aclose()
            memory = max(_hwm(pid) for pid in _tree(proc.pid))
            return {"tokens_per_s": {str(k): v for k, v in res["tokens_per_s"].items()}, "memory_mib": memory}
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(60)

    return asyncio.run(run())


def part_trainer(spec: dict[str, Any]) -> dict[str, Any]:
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner

    cfg = TrainerConfig(
        model_path=spec["model"], run_dir=tempfile.mkdtemp(), lr=1e-5, lora_rank=16 if spec["mode"] == "lora" else 0,
        mixed_precision="bf16" if spec["dtype"] == "bf16" else "no", prefix_sharing=spec["layout"] == "shared",
        max_tokens_per_micro_batch=4096,
    )  # fmt: skip
    learner = Learner(cfg, cfg.model_path)
    times, computed = [], 0.0
    for step in range(5):
        items = _groups(step, spec["vocab"])
        t = time.perf_counter()
        stats = learner.train_step(items, version=0).stats
        times.append(time.perf_counter() - t)
        computed = stats["computed_tokens"]
    profile = (
        _profile(lambda: learner.train_step(_groups(9, spec["vocab"]), version=0))
        if spec.get("profile")
        else []
    )
    step_s = statistics.median(times[2:])
    return {"tokens_per_s": computed / step_s, "step_s": step_s, "computed_tokens": computed,
            "memory_mib": _self_hwm(), "profile": profile}  # fmt: skip


def part_logprobs(spec: dict[str, Any]) -> dict[str, Any]:
    """Sample 512 tokens with the embedded engine (in process), score them with the trainer."""
    import torch

    from swarmrl.schemas import Sample
    from swarmrl.services.engine.engine_core import EngineCore
    from swarmrl.services.engine.sampling import SamplingParams
    from swarmrl.services.trainer.batching import Scored, pack_shared
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner

    engine = EngineCore(spec["model"], dtype=spec["engine_dtype"], max_batch=16)
    prompts = _prompts(16, spec["vocab"])
    params = SamplingParams(max_new_tokens=32, temperature=1.0, ignore_eos=True)
    outs = [f.result() for f in [engine.submit(p, params) for p in prompts]]
    engine.close()
    cfg = TrainerConfig(
        model_path=spec["model"], run_dir=tempfile.mkdtemp(),
        mixed_precision="bf16" if spec["trainer_dtype"] == "bf16" else "no",
    )  # fmt: skip
    learner = Learner(cfg, cfg.model_path)
    diffs = []
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        ids = p + o.output_ids
        sample = Sample(sample_id=f"s{i}", model="m", episode_id=f"e{i}", agent="a", task_id="t", group_key="g",
                        token_ids=ids, loss_mask=[0] * len(p) + [1] * len(o.output_ids),
                        logprobs=[0.0] * len(p) + o.output_logprobs, policy_versions=[-1] * len(p) + [0] * len(o.output_ids),
                        reward=0.0)  # fmt: skip
        (mb,) = pack_shared([Scored(sample, 0.0)], 4096)
        mine = learner.logprobs(mb).float()
        diffs.append(
            (
                mine
                - torch.tensor(
                    o.output_logprobs[1:] if len(mine) < len(o.output_logprobs) else o.output_logprobs
                )
            ).abs()
        )
    d = torch.cat(diffs)
    return {"mean_abs": float(d.mean()), "max_abs": float(d.max()), "tokens": int(d.numel())}


def part_decode_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """Profile 8 decode steps of 16 rows as the embedded engine runs them (its attention, its in-place
    KV cache, its sampler), in this thread: torch's profiler records the thread it runs in."""
    import torch
    from transformers import AutoModelForCausalLM

    from swarmrl.services.engine.attention import ENGINE_ATTENTION
    from swarmrl.services.engine.kv_batch import cache_argument, new_cache
    from swarmrl.services.engine.sampling import SamplingParams, sample

    model = AutoModelForCausalLM.from_pretrained(
        spec["model"], dtype=getattr(torch, spec["dtype"]), attn_implementation=ENGINE_ATTENTION
    ).eval()
    ids = torch.tensor(_prompts(16, spec["vocab"]))
    arg, cache = cache_argument(model), new_cache()
    params = [SamplingParams(temperature=1.0)] * 16
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **{arg: cache})
        last = torch.tensor(sample(out.logits[:, -1], params, [None] * 16, scratch=True)[0])[:, None]

        def steps(first: int, n: int) -> None:
            nonlocal last
            for i in range(first, first + n):
                pos = torch.full((16, 1), PROMPT_LEN + i)
                out = model(input_ids=last, position_ids=pos, use_cache=True, **{arg: cache})
                last = torch.tensor(sample(out.logits[:, -1], params, [None] * 16, scratch=True)[0])[:, None]

        steps(0, 4)  # warm up
        rows = _profile(lambda: steps(4, 8))
    return {"profile": rows}


PARTS = {"gemm": part_gemm, "generate": part_generate, "engine": part_engine, "trainer": part_trainer,
         "logprobs": part_logprobs, "decode_profile": part_decode_profile}  # fmt: skip


# -- helpers ----------------------------------------------------------------------------------------


def _prompts(rows: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(rows)
    return [[rng.randrange(100, vocab - 100) for _ in range(PROMPT_LEN)] for _ in range(rows)]


def _groups(seed: int, vocab: int) -> list[Any]:
    import random

    from swarmrl.schemas import Sample
    from swarmrl.services.trainer.batching import Scored

    rng = random.Random(seed)
    items = []
    for g in range(GROUPS):
        prompt = [rng.randrange(100, vocab - 100) for _ in range(PROMPT)]
        for i in range(ANSWERS):
            ids = prompt + [rng.randrange(100, vocab - 100) for _ in range(ANSWER)]
            s = Sample(sample_id=f"{seed}-{g}-{i}", model="m", episode_id=f"e{seed}-{g}-{i}", agent="a", task_id="t",
                       group_key=f"g{g}", token_ids=ids, loss_mask=[0] * PROMPT + [1] * ANSWER,
                       logprobs=[0.0] * PROMPT + [-3.0] * ANSWER, policy_versions=[-1] * PROMPT + [0] * ANSWER,
                       reward=float(i % 2))  # fmt: skip
            items.append(Scored(s, 1.0 if i % 2 else -1.0))
    return items


def _profile(fn: Any, top: int = 8) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "share": e.self_cpu_time_total / total, "calls": e.count} for e in events[:top]]


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (a vLLM engine runs its model in a child process)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for child in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in child.read_text().split()]
    return out


def _hwm(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _self_hwm() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_part(name: str, spec: dict[str, Any], threads: int, cache: Path) -> dict[str, Any]:
    """Run one part in a fresh process on `threads` torch threads; its JSON result.

    Each result is kept in `cache` (keyed by the part and its spec), so a rerun after a failure
    measures only what is missing."""
    key = hashlib.sha256(json.dumps([name, spec, threads], sort_keys=True).encode()).hexdigest()[:12]
    kept = cache / f"{name}-{key}.json"
    if kept.exists():
        print(f"  {name} {spec.get('label', '')} (kept)", flush=True)
        return dict(json.loads(kept.read_text()))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, __file__, "--part", name, "--spec", json.dumps(spec)]
    print(f"  {name} {spec.get('label', '')}", flush=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"part {name} {spec} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    kept.write_text(json.dumps(result))
    return dict(result)


# -- the run ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    from swarmrl.core.precision import parameter_count, resolve_dtype
    from swarmrl.models import is_real, model_dir
    from swarmrl.services.engine.vllm_backend import find_vllm_python

    args.parts.mkdir(parents=True, exist_ok=True)

    def part(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return run_part(name, spec, args.threads, args.parts)

    model = str(model_dir(args.model) if is_real(args.model) else Path(args.model).resolve())
    params = parameter_count(model)
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(model).get_text_config().vocab_size)
    base = {"model": model, "vocab": vocab, "threads": args.threads}
    log = args.parts / "engine.log"
    print(f"model {model}: {params / 1e6:.1f}M parameters, vocabulary {vocab}", flush=True)
    gemm = part("gemm", base)
    best = max(gemm["fp32"], gemm["bf16"])
    engines: list[dict[str, Any]] = []
    vllm = "" if args.skip_vllm else (find_vllm_python() or "")
    default_dtype = resolve_dtype("auto", model)
    for dtype in ("float32", "bfloat16"):
        g = part("generate", {**base, "dtype": dtype, "label": dtype})
        engines += [{"engine": "transformers.generate", "dtype": dtype, "rows": int(r), "tokens_per_s": v,
                     "memory_mib": g["memory_mib"], "default": False} for r, v in g["tokens_per_s"].items()]  # fmt: skip
        for backend in ("embedded", *(["vllm"] if vllm else [])):
            spec = {**base, "backend": backend, "dtype": dtype, "log": str(log), "vllm_python": vllm if backend == "vllm" else "",
                    "label": f"{backend} {dtype}"}  # fmt: skip
            e = part("engine", spec)
            engines += [{"engine": backend, "dtype": dtype, "rows": int(r), "tokens_per_s": v, "memory_mib": e["memory_mib"],
                         "default": backend == "embedded" and dtype == default_dtype} for r, v in e["tokens_per_s"].items()]  # fmt: skip
    floor = {
        e["rows"]: e["tokens_per_s"]
        for e in engines
        if e["engine"] == "transformers.generate" and e["dtype"] == "float32"
    }
    for e in engines:
        e["vs_generate"] = e["tokens_per_s"] / floor[e["rows"]]
        e["gemm_share"] = 2 * params * e["tokens_per_s"] / best
    trainer = []
    for mode in ("full", "lora"):
        for layout in ("shared", "packed"):
            for dtype in ("fp32", "bf16"):
                spec = {**base, "mode": mode, "layout": layout, "dtype": dtype, "label": f"{mode} {layout} {dtype}",
                        "profile": (mode, layout, dtype) == ("full", "shared", "bf16")}  # fmt: skip
                t = part("trainer", spec)
                flops = (6 if mode == "full" else 4) * params
                trainer.append({"mode": mode, "layout": layout, "dtype": dtype, "tokens_per_s": t["tokens_per_s"],
                                "step_s": t["step_s"], "computed_tokens": t["computed_tokens"],
                                "gemm_share": flops * t["tokens_per_s"] / best, "memory_mib": t["memory_mib"],
                                "default": (mode, layout, dtype) == ("full", "shared", "bf16" if default_dtype == "bfloat16" else "fp32"),
                                **({"profile": t["profile"]} if t["profile"] else {})})  # fmt: skip
    logprobs = []
    for engine_dtype, trainer_dtype in (("float32", "fp32"), ("bfloat16", "bf16"), ("bfloat16", "fp32")):
        spec = {
            **base,
            "engine_dtype": engine_dtype,
            "trainer_dtype": trainer_dtype,
            "label": f"{engine_dtype}/{trainer_dtype}",
        }
        logprobs.append(
            {
                "engine_dtype": engine_dtype,
                "trainer_dtype": trainer_dtype,
                **part("logprobs", spec),
            }
        )
    decode = part("decode_profile", {**base, "dtype": default_dtype, "label": default_dtype})
    return {"machine": machine(), "model": args.model, "parameters": params, "vocab": vocab, "threads": args.threads,
            "gemm_flops": best, "gemm_flops_fp32": gemm["fp32"], "gemm_flops_bf16": gemm["bf16"],
            "engines": engines, "trainer": trainer, "logprobs": logprobs,
            "profiles": {"decode_16_rows": decode["profile"],
                         "trainer_step": next(t["profile"] for t in trainer if "profile" in t)}}  # fmt: skip


def markdown(r: dict[str, Any]) -> str:
    from swarmrl.machine import describe

    def table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> list[str]:
        out = ["| " + " | ".join(c[1] for c in cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
        for row in rows:
            out.append(
                "| "
                + " | ".join(
                    fmt.format(row[key]) if row.get(key) is not None else "-" for key, _, fmt in cols
                )
                + " |"
            )
        return out

    engines = sorted(r["engines"], key=lambda e: (e["rows"], e["engine"], e["dtype"]))
    for e in engines:
        e["mark"] = "**default**" if e["default"] else ""
    for t in r["trainer"]:
        t["mark"] = "**default**" if t["default"] else ""
    prof = lambda rows: ", ".join(f"`{p['op']}` {p['share']:.0%}" for p in rows)  # noqa: E731
    return "\n".join([
        f"# A real model on this machine: {r['model']} ({r['parameters'] / 1e6:.1f}M parameters, vocabulary {r['vocab']:,})",
        "",
        f"{describe(r['machine'])}; {r['machine']['date']}. {r['threads']} torch threads for every part, each in a "
        "process of its own, one after the other. Written by `python bench/real_model.py`.",
        "",
        f"Best GEMM: fp32 {r['gemm_flops_fp32'] / 1e9:.0f} GFLOP/s, bf16 {r['gemm_flops_bf16'] / 1e9:.0f} GFLOP/s "
        f"(square 2048 and 4096 matmuls); shares below are of the best, {r['gemm_flops'] / 1e9:.0f} GFLOP/s.",
        "",
        "## Generation",
        "",
        f"{PROMPT_LEN}-token prompts, {NEW_TOKENS} new tokens each, temperature 1. Engines through their HTTP API "
        "(`swarmrl serve engine --max-batch 64`); `transformers.generate` in process with `do_sample=True`. "
        "vs generate: against fp32 `generate` at the same rows (the floor). GEMM share: 2 x parameters x tokens/s.",
        "",
        *table(engines, [("rows", "rows", "{}"), ("engine", "engine", "{}"), ("dtype", "dtype", "{}"),
                         ("tokens_per_s", "tokens/s", "{:.0f}"), ("vs_generate", "vs generate", "{:.2f}x"),
                         ("gemm_share", "GEMM share", "{:.1%}"), ("memory_mib", "peak MiB", "{:.0f}"), ("mark", "", "{}")]),
        "",
        "## Trainer",
        "",
        f"One step: {GROUPS} GRPO groups of {ANSWERS} answers of {ANSWER} tokens below a shared {PROMPT}-token "
        "prompt; computed tokens per second (prefix-shared rows compute each prompt once), median of 3 steps "
        "after 2. GEMM share: 6 (full) or 4 (LoRA) x parameters x computed tokens/s.",
        "",
        *table(r["trainer"], [("mode", "mode", "{}"), ("layout", "layout", "{}"), ("dtype", "dtype", "{}"),
                              ("computed_tokens", "computed tokens", "{:.0f}"), ("step_s", "step s", "{:.2f}"),
                              ("tokens_per_s", "tokens/s", "{:.0f}"), ("gemm_share", "GEMM share", "{:.1%}"),
                              ("memory_mib", "peak MiB", "{:.0f}"), ("mark", "", "{}")]),
        "",
        "## Engine against trainer logprobs",
        "",
        "The engine samples 16 x 32 tokens; the trainer scores the same tokens as a step would.",
        "",
        *table(r["logprobs"], [("engine_dtype", "engine", "{}"), ("trainer_dtype", "trainer", "{}"),
                               ("mean_abs", "mean abs diff", "{:.4f}"), ("max_abs", "max abs diff", "{:.4f}"),
                               ("tokens", "tokens", "{}")]),
        "",
        "## Where the time goes",
        "",
        f"- a 16-row decode step (embedded engine, its default dtype): {prof(r['profiles']['decode_16_rows'])}",
        f"- a trainer step (full, shared, bf16): {prof(r['profiles']['trainer_step'])}",
        "",
    ])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default="smollm2-135m-instruct", help="a shipped model, a .gguf file or an HF dir"
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads of every part")
    p.add_argument(
        "--skip-vllm", action="store_true", help="leave vLLM out (else it runs where `just vllm-env` put it)"
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--parts",
        type=Path,
        default=Path(tempfile.gettempdir()) / "swarmrl-real-model-parts",
        help="where each part's result is kept; a rerun measures only the parts missing there",
    )
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](json.loads(args.spec))))
        return
    result = run(args)
    write_json("real-model", result, args.out)
    (args.out / "real-model.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
