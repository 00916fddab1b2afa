"""`swarmrl bootstrap-model`: build the tiny offline model (tokenizer, Qwen2 architecture, SFT warm
start on the default tasks) into a plain HF model directory. Never downloads anything."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

EPILOG = """\
examples:
  swarmrl bootstrap-model                       build the default model into the cache (if missing)
  swarmrl bootstrap-model --out /tmp/m --force  rebuild into /tmp/m
  swarmrl bootstrap-model --steps 0 --out /tmp/r  random init only (seconds; for tests)
  swarmrl bootstrap-model --out /tmp/m --eval 64  then measure held-out success per task

The directory loads with AutoModelForCausalLM / AutoTokenizer like any HF model; any other
model directory (e.g. Qwen2.5-0.5B-Instruct) can be used in its place.
"""


def _parser() -> argparse.ArgumentParser:
    from swarmrl.bootstrap.model import DEFAULT_STEPS

    p = argparse.ArgumentParser(
        prog="swarmrl bootstrap-model",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: $SWARMRL_HOME/models/tiny-<hash>, or ~/.cache/swarmrl/...)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed; the same seed gives identical weights (default 0)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"SFT warm-start steps; 0 = random init (default {DEFAULT_STEPS})",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if the directory already holds a model")
    p.add_argument(
        "--eval",
        type=int,
        default=0,
        metavar="N",
        help="after building, play N held-out episodes of each task and print success rates",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (default: torch's choice); 1 is much faster on a machine shared with other jobs",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Heavy imports after parsing, so `--help` is instant.
    import torch
    from rich.console import Console

    from swarmrl.bootstrap.model import build_model, ensure_default_model

    console = Console(stderr=True)
    if args.steps < 0:
        console.print(f"[red]--steps must be >= 0, got {args.steps}")
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.out is None:
        out = ensure_default_model(
            seed=args.seed, steps=args.steps, progress=not args.quiet, force=args.force
        )
    elif (args.out / "meta.json").exists() and not args.force:
        out = args.out
        console.print(f"{out} already holds a model (use --force to rebuild)")
    else:
        if args.force and args.out.exists():
            shutil.rmtree(args.out)
        out = build_model(args.out, seed=args.seed, warm_start_steps=args.steps, progress=not args.quiet)
    meta = json.loads((out / "meta.json").read_text())
    console.print(
        f"model: {out}\n  params {meta['param_count']:,}  steps {meta['warm_start_steps']}  "
        f"final SFT loss {meta['final_sft_loss']}  build {meta['build_time_s']}s"
    )
    if args.eval > 0:
        from swarmrl.agents.tasks import TASKS
        from swarmrl.bootstrap.evaluate import evaluate_offline

        for name in TASKS:
            r = evaluate_offline(out, name, n=args.eval, seed=args.seed)
            console.print(
                f"  eval {name}: success {r.success_rate:.1%}  reward {r.mean_reward:.3f}  "
                f"turns {r.mean_turns:.2f}  ({r.episodes} episodes, {r.seconds}s)"
            )
    print(out)  # stdout carries only the path, for scripts: MODEL=$(swarmrl bootstrap-model)
    return 0
