"""Trainer benchmark: prefix-shared micro-batches vs samples packed side by side, on recorded samples.

For each task, real trainer steps of a recorded run (each `TrainStep.sample_ids`, with the samples,
read from the run's ledger Parquet via DuckDB) and trained on by one `Learner` in both
layouts, interleaved so machine load hits both alike: `pack_shared` (the default, each shared prefix
computed once) and `pack` (each sample computed whole). Reported per task: computed tokens per step
(the rows' lengths), the samples' own tokens, trained tokens, and the median step time.

Writes bench/results/trainer.{json,md}. The samples come from runs made on this machine (`just up`
for calculator; a cocktail or team swarm from `examples/` for the others): `--run DIR` names them,
by default the newest run under runs/ that holds each task.

`--long`: rows of 4k-32k tokens instead, on a model with a realistic layer shape (Qwen2.5-0.5B's:
hidden 896, 14 heads, 2 kv heads, MLP 4864; random initialisation, `--layers` of them). Each step is
one GRPO group of 8 answers of L/16 tokens below an L/2-token prompt: the shared row holds L tokens,
packed rows 4.5x that. Each (L, layout) runs one step in a process of its own, which reports its peak
resident memory and step time. Writes bench/results/trainer-long.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json

from swarmrl.machine import describe

TASKS = ("calculator", "guess_number", "team_calculator")


def find_runs(explicit: list[Path], root: Path) -> dict[str, Path]:
    """Task -> the run dir its samples are read from (explicit runs first, then newest under root)."""
    import duckdb

    candidates = explicit or sorted(
        (p for p in root.glob("*/ledger/samples") if any(p.rglob("*.parquet"))),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    found: dict[str, Path] = {}
    for c in candidates:
        run = c if (c / "ledger").is_dir() else c.parent.parent
        glob = str(run / "ledger" / "samples" / "**" / "*.parquet")
        tasks = duckdb.execute(
            f"select distinct task from read_parquet('{glob}', union_by_name=true)"
        ).fetchall()
        for (task,) in tasks:
            found.setdefault(task, run)
    return found


def load_batches(run: Path, task: str, steps: int, groups: int, seed: int) -> list[list[Any]]:
    """`steps` of the run's real trainer steps that trained `task`, as `Scored` samples: each batch is
    one `TrainStep.sample_ids` (older runs lack them: then `groups` random groups whose rewards differ,
    the ones a trainer trains), advantages recomputed from the rewards within each group."""
    import duckdb

    from swarmrl.schemas import Sample
    from swarmrl.services.trainer.batching import Scored

    ledger = run / "ledger"
    sglob = str(ledger / "samples" / "**" / "*.parquet")
    tglob = str(ledger / "train_steps" / "**" / "*.parquet")
    con = duckdb.connect()
    cur = con.execute(f"select * from read_parquet('{sglob}', union_by_name=true) where task = ?", [task])
    names = [d[0] for d in cur.description]
    fields = set(Sample.model_fields)
    samples = {}
    for r in cur.fetchall():
        row = dict(zip(names, r, strict=True))
        s = Sample(**{k: v for k, v in row.items() if k in fields and v is not None})
        samples[s.sample_id] = s
    cur = con.execute(f"select * from read_parquet('{tglob}', union_by_name=true) limit 0")
    columns = [d[0] for d in cur.description]
    batches: list[list[Sample]] = []
    if "sample_ids" in columns:  # the run's real steps
        for (ids,) in con.execute(
            f"select sample_ids from read_parquet('{tglob}', union_by_name=true)"
        ).fetchall():
            batch = [samples[i] for i in json.loads(ids) if i in samples]
            if batch:
                batches.append(batch)
    else:  # a run older than TrainStep.sample_ids: steps of `groups` groups the trainer would train
        by_group: dict[str, list[Sample]] = {}
        for s in samples.values():
            by_group.setdefault(s.group_key, []).append(s)
        trainable = sorted(k for k, v in by_group.items() if len(v) >= 2 and len({s.reward for s in v}) > 1)
        random.Random(seed).shuffle(trainable)
        for i in range(0, len(trainable) - groups + 1, groups):
            batches.append([s for k in trainable[i : i + groups] for s in by_group[k]])
    out = []
    for batch in random.Random(seed).sample(batches, steps):
        by_key: dict[str, list[Sample]] = {}
        for s in batch:
            by_key.setdefault(s.group_key, []).append(s)
        items = []
        for members in by_key.values():
            rewards = [s.reward for s in members]
            mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
            items += [Scored(s, (s.reward - mean) / (std + 1e-6)) for s in members]
        out.append(items)
    return out


def measure(learner: Any, batches: list[list[Any]], repeats: int, micro_tokens: int) -> dict[str, Any]:
    from swarmrl.services.trainer.batching import pack, pack_shared, truncate

    batches = [[type(it)(truncate(it.sample, micro_tokens), it.advantage) for it in b] for b in batches]
    layouts = {"shared": True, "packed": False}
    times: dict[str, list[float]] = {k: [] for k in layouts}
    tokens = {k: 0 for k in layouts}
    for name, fn in (("shared", pack_shared), ("packed", pack)):
        tokens[name] = sum(mb.tokens for b in batches for mb in fn(b, micro_tokens))
    base = learner.cfg
    learner.train_step(batches[0], version=0)  # warm-up (allocator, first-call costs)
    for _ in range(repeats):
        for b in batches:
            for name, sharing in layouts.items():  # interleaved
                learner.cfg = base.model_copy(update={"prefix_sharing": sharing})
                t = time.perf_counter()
                learner.train_step(b, version=0)
                times[name].append(time.perf_counter() - t)
    learner.cfg = base
    n = len(batches)
    sample_tokens = sum(len(it.sample.token_ids) for b in batches for it in b)
    trained = sum(sum(it.sample.loss_mask[1:]) for b in batches for it in b)
    return {
        "steps": n,
        "samples_per_step": sum(len(b) for b in batches) / n,
        "sample_tokens_per_step": sample_tokens / n,
        "trained_tokens_per_step": trained / n,
        "computed_tokens_per_step": {k: v / n for k, v in tokens.items()},
        "step_s_median": {k: statistics.median(v) for k, v in times.items()},
        "ratio_tokens": tokens["packed"] / tokens["shared"],
        "ratio_step_time": statistics.median(times["packed"]) / statistics.median(times["shared"]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from swarmrl.bootstrap import ensure_default_model
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner

    runs = find_runs(args.run, Path(args.runs_root))
    if not any(task in runs for task in TASKS):
        raise SystemExit(
            f"no recorded samples of {', '.join(TASKS)} in {args.run or args.runs_root}: run `just up` "
            "(and examples/team.toml, examples/cocktail.toml) first, or pass --run DIR"
        )
    model_dir = Path(args.model) if args.model else ensure_default_model()
    results: dict[str, Any] = {}
    for micro in args.micro_tokens:
        cfg = TrainerConfig(model_path=str(model_dir), run_dir=tempfile.mkdtemp(),
                            max_tokens_per_micro_batch=micro)  # fmt: skip
        learner = Learner(cfg, model_dir)
        for task in TASKS:
            if task not in runs:
                print(f"no recorded samples of {task} under {args.runs_root}: skipped", file=sys.stderr)
                continue
            batches = load_batches(runs[task], task, args.steps, args.groups, args.seed)
            r = measure(learner, batches, args.repeats, micro)
            r["run"] = str(runs[task])
            results[f"{task}@{micro}"] = r
            print(f"{task} rows of {micro}: {r['ratio_tokens']:.2f}x fewer computed tokens, "
                  f"{r['ratio_step_time']:.2f}x faster steps", file=sys.stderr)  # fmt: skip
    return {
        "benchmark": "trainer",
        "model_dir": str(model_dir),
        "repeats": args.repeats,
        "results": results,
        "machine": machine(),
    }


LONG_ANSWERS = 8


def long_items(length: int, seed: int = 0) -> list[Any]:
    """One GRPO group whose prefix tree is `length` tokens: an L/2 prompt and 8 answers of L/16."""
    from swarmrl.schemas import Sample
    from swarmrl.services.trainer.batching import Scored

    rng = random.Random(seed)
    prompt = [rng.randrange(10, 700) for _ in range(length // 2)]
    out = []
    for i in range(LONG_ANSWERS):
        answer = [rng.randrange(10, 700) for _ in range(length // 16)]
        ids = prompt + answer
        out.append(Scored(Sample(
            sample_id=f"s{i}", model="m", episode_id=f"e{i}", agent="a", task_id="t", group_key="g",
            token_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(answer), logprobs=[-6.0] * len(ids),
            policy_versions=[0] * len(ids), reward=float(i % 2),
        ), 1.0 if i % 2 else -1.0))  # fmt: skip
    return out


def long_one(length: int, layout: str, layers: int) -> dict[str, Any]:
    """One step on a row of `length` tokens in this process; its time and this process's peak RSS."""
    import resource

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swarmrl.bootstrap.tokenizer import build_tokenizer
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    config = Qwen2Config(
        vocab_size=792, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=65536, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(tmp / "model")
    build_tokenizer().save_pretrained(tmp / "model")
    cfg = TrainerConfig(model_path=str(tmp / "model"), run_dir=str(tmp / "run"), max_tokens_per_micro_batch=length,
                        prefix_sharing=layout == "shared")  # fmt: skip
    learner = Learner(cfg, tmp / "model")
    learner.train_step(long_items(256, seed=1), version=0)  # warm-up: optimizer state, first-call costs
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    stats = learner.train_step(long_items(length), version=0).stats
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"tokens": length, "layout": layout, "step_s": round(seconds, 2),
            "computed_tokens": stats["computed_tokens"], "peak_rss_gib": round(peak / 2**20, 2),
            "rss_before_step_gib": round(before / 2**20, 2)}  # fmt: skip


def run_long(args: argparse.Namespace) -> dict[str, Any]:
    import subprocess

    rows = []
    for length in args.lengths:
        for layout in ("shared", "packed"):
            if layout == "packed" and length > args.packed_max:
                rows.append(
                    {
                        "tokens": length,
                        "layout": layout,
                        "error": f"not run (beyond --packed-max {args.packed_max})",
                    }
                )
                continue
            cmd = [sys.executable, __file__, "--long-one", str(length), layout, "--layers", str(args.layers)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                row = {
                    "tokens": length,
                    "layout": layout,
                    "error": f"exit {proc.returncode}: {tail[0][:200]}",
                }
            else:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    return {"benchmark": "trainer-long", "layers": args.layers, "rows": rows, "machine": machine()}


def write_long_md(result: dict[str, Any], out: Path) -> None:
    m = result["machine"]
    by = {(r["tokens"], r["layout"]): r for r in result["rows"]}
    lines = [
        "# Trainer benchmark: long rows (tree attention segment by segment)",
        "",
        f"{describe(m)}; {m['date']}.",
        "",
        f"A model with Qwen2.5-0.5B's layer shape (hidden 896, 14 heads, 2 kv heads, MLP 4864), "
        f"{result['layers']} layer(s), random initialisation, float32 on the CPU. One trainer step on one GRPO "
        "group: 8 answers of L/16 tokens below an L/2-token prompt. *shared*: one row, the prompt computed "
        "once (L tokens); *packed*: each sample whole (4.5 L tokens). Each cell ran in a process of its "
        "own: peak resident memory of that process (model, optimizer, activations) and the step's time. "
        "The dense [L, L] float32 mask the trainer built before (one per row) is given for scale.",
        "",
        "| row tokens L | dense mask (GiB) | shared: step s | shared: peak GiB | packed: step s | packed: peak GiB | step-time ratio |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for length in sorted({r["tokens"] for r in result["rows"]}):
        sh, pk = by.get((length, "shared"), {}), by.get((length, "packed"), {})

        def cell(r: dict[str, Any], key: str) -> str:
            return str(r[key]) if key in r else r.get("error", "-")

        ratio = f"{pk['step_s'] / sh['step_s']:.2f}x" if "step_s" in sh and "step_s" in pk else "-"
        lines.append(
            f"| {length} | {length * length * 4 / 2**30:.2f} | {cell(sh, 'step_s')} | {cell(sh, 'peak_rss_gib')} | "
            f"{cell(pk, 'step_s')} | {cell(pk, 'peak_rss_gib')} | {ratio} |"
        )
    lines += ["", "Reproduce: `python bench/trainer.py --long`.", ""]
    (out / "trainer-long.md").write_text("\n".join(lines))


def write_md(result: dict[str, Any], out: Path) -> None:
    m = result["machine"]
    lines = [
        "# Trainer benchmark: prefix-shared micro-batches",
        "",
        f"{describe(m)}; {m['date']}.",
        "",
        "The same recorded samples (real trainer steps of a run: each step's `TrainStep.sample_ids`, read "
        "from its ledger) trained on by one `Learner` (the tiny model, float32, CPU) in both layouts, interleaved; "
        "step time is the median over every step and repeat. *packed*: samples side by side (the layout "
        "before prefix sharing); *shared*: prefix trees, each shared prefix computed once. Loss and "
        "gradients are equal (`tests/unit/trainer/test_prefix_sharing.py`).",
        "",
        "| task @ row tokens | samples/step | sample tokens/step | computed packed → shared | step s packed → shared | computed tokens ratio | step-time ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in result["results"].items():
        c, t = r["computed_tokens_per_step"], r["step_s_median"]
        lines.append(
            f"| {name} | {r['samples_per_step']:.0f} | {r['sample_tokens_per_step']:.0f} | "
            f"{c['packed']:.0f} → {c['shared']:.0f} | {t['packed']:.3f} → {t['shared']:.3f} | "
            f"**{r['ratio_tokens']:.2f}x** | **{r['ratio_step_time']:.2f}x** |"
        )
    lines += ["", "Samples from: " + ", ".join(sorted({r["run"] for r in result["results"].values()})), ""]
    lines += ["Reproduce: `python bench/trainer.py` (after runs that recorded these tasks).", ""]
    (out / "trainer.md").write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, action="append", default=[], help="run dir to read samples from")
    p.add_argument("--runs-root", default="runs", help="where to look for runs when --run is not given")
    p.add_argument("--groups", type=int, default=4, help="groups per step for runs without sample ids")
    p.add_argument("--steps", type=int, default=3, help="distinct steps (batches) per task")
    p.add_argument("--repeats", type=int, default=2, help="timed passes over the steps per layout")
    p.add_argument("--micro-tokens", type=int, nargs="+", default=[512, 2048],
                   help="trainer row lengths to measure (512 is up's default)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="", help="HF model dir (default: the bootstrapped tiny model)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--long", action="store_true", help="long rows on a realistic layer shape instead (see above)"
    )
    p.add_argument(
        "--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768], help="--long: row tokens"
    )
    p.add_argument("--layers", type=int, default=1, help="--long: layers of the model")
    p.add_argument("--packed-max", type=int, default=8192,
                   help="--long: longest row also run packed (4.5x the tokens, quadratic attention per sample)")  # fmt: skip
    p.add_argument("--long-one", nargs=2, metavar=("TOKENS", "LAYOUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.long_one:
        print(json.dumps(long_one(int(args.long_one[0]), args.long_one[1], args.layers)))
        return
    if args.long:
        result = run_long(args)
        write_json("trainer-long", result, args.out)
        write_long_md(result, args.out)
        print(f"wrote {args.out / 'trainer-long.json'} and trainer-long.md", file=sys.stderr)
        return
    result = run(args)
    write_json("trainer", result, args.out)
    write_md(result, args.out)
    print(f"wrote {args.out / 'trainer.json'} and trainer.md", file=sys.stderr)


if __name__ == "__main__":
    main()
