"""`swarmrl bootstrap-model`: build a tiny offline model (tokenizer, a preset's architecture, SFT warm
start on its sources: tasks, or roles of multi-role tasks) into a plain HF model directory. Never
downloads anything."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

EPILOG = """\
presets:
{presets}

SFT sources (--sources, comma-separated; order matters, it seeds the demo stream):
  {sources}
  a task name warm-starts on its demonstrations; TASK.ROLE on one role of a multi-role task
  (that role's conversations only), so each model of a team can learn its own role.

examples:
  swarmrl bootstrap-model                       build the default model (preset tiny) into the cache
  swarmrl bootstrap-model --out /tmp/m --force  rebuild into /tmp/m
  swarmrl bootstrap-model --steps 0 --out /tmp/r  random init only (seconds; for tests)
  swarmrl bootstrap-model --out /tmp/m --eval 64  then measure held-out success per source
  swarmrl bootstrap-model --preset tiny-llama --sources team_calculator.reporter --eval 128 --threads 1
                                                a Llama model warm-started on the reporter role;
                                                its eval scores the reporter's own metric, the
                                                other roles replaced by correct scripted replies

The directory loads with AutoModelForCausalLM / AutoTokenizer like any HF model; any other
model directory (e.g. Qwen2.5-0.5B-Instruct) can be used in its place.
"""


def _parser() -> argparse.ArgumentParser:
    from swarmrl.bootstrap.presets import DEFAULT_PRESET, PRESETS, SFT_ROUNDS, source_names

    presets = "\n".join(
        f"  {p.name:<12}{p.description}; default sources {','.join(p.sources)}, {p.steps} steps"
        for p in PRESETS.values()
    )
    p = argparse.ArgumentParser(
        prog="swarmrl bootstrap-model",
        description=__doc__,
        epilog=EPILOG.format(presets=presets, sources=", ".join(source_names())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--preset", default=DEFAULT_PRESET,
        help=f"architecture and size: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")  # fmt: skip
    add("--sources", metavar="A,B.ROLE",
        help="SFT sources, comma-separated (default: the preset's own, see below)")  # fmt: skip
    add("--out", type=Path, help="output directory (default: $SWARMRL_HOME/models/<preset>-<sources>-"
        "<steps>s-seed<seed>-<hash>, $SWARMRL_HOME defaulting to ~/.cache/swarmrl)")  # fmt: skip
    add("--seed", type=int, default=0, help="seed; the same seed gives identical weights (default 0)")
    add("--steps", type=int, help="SFT warm-start steps; 0 = random init (default: the preset's for its own "
        f"sources, else {SFT_ROUNDS} per batch of one round over the sources)")  # fmt: skip
    add("--force", action="store_true", help="rebuild even if the directory already holds a model")
    add("--eval", type=int, default=0, metavar="N", help="after building, play N held-out episodes per "
        "source and print success rates (a TASK.ROLE source: that role's own metric, the other roles "
        "scripted as correct)")  # fmt: skip
    add("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice); 1 is much "
        "faster on a machine shared with other jobs")  # fmt: skip
    add("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rich.console import Console

    from swarmrl.bootstrap.presets import default_steps, ensure_model, resolve_sources

    console = Console(stderr=True)
    try:
        sources = resolve_sources(args.preset, args.sources)
    except ValueError as exc:
        console.print(f"[red]{exc}")
        return 2
    steps = default_steps(args.preset, sources) if args.steps is None else args.steps
    if steps < 0:
        console.print(f"[red]--steps must be >= 0, got {steps}")
        return 2
    # Heavy imports after validation, so `--help` and bad names answer at once.
    import torch

    from swarmrl.bootstrap.model import build_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.out is None:
        out = ensure_model(
            args.preset, sources, steps, seed=args.seed, progress=not args.quiet, force=args.force
        )
    elif (args.out / "meta.json").exists() and not args.force:
        out = args.out
        console.print(f"{out} already holds a model (use --force to rebuild)")
    else:
        if args.force and args.out.exists():
            shutil.rmtree(args.out)
        out = build_model(args.out, seed=args.seed, warm_start_steps=steps, progress=not args.quiet,
                          preset=args.preset, sources=sources)  # fmt: skip
    meta = json.loads((out / "meta.json").read_text())
    console.print(
        f"model: {out}\n  preset {meta.get('preset', args.preset)}  sources {','.join(meta.get('sources', sources))}  "
        f"params {meta['param_count']:,}  steps {meta['warm_start_steps']}  "
        f"final SFT loss {meta['final_sft_loss']}  build {meta['build_time_s']}s"
    )
    if args.eval > 0:
        from swarmrl.bootstrap.evaluate import evaluate_offline

        for source in meta.get("sources", sources):
            r = evaluate_offline(out, source, n=args.eval, seed=args.seed)
            if r.role is not None:
                names = ", ".join(f"{k} {v:.1%}" for k, v in sorted(r.metrics.items()))
                console.print(
                    f"  eval {source}: {r.metric:.1%} on its own metric  reward {r.mean_reward:.3f}  "
                    f"team success {r.success_rate:.1%}  ({names}; {r.episodes} episodes, {r.seconds}s)"
                )
            else:
                console.print(
                    f"  eval {source}: success {r.success_rate:.1%}  reward {r.mean_reward:.3f}  "
                    f"turns {r.mean_turns:.2f}  ({r.episodes} episodes, {r.seconds}s)"
                )
    print(out)  # stdout carries only the path, for scripts: MODEL=$(swarmrl bootstrap-model)
    return 0
