"""`swarmrl export RUN --model M --to DIR`: a trained model of a run as a plain HF model directory.

A trainer checkpoint (`<run>/checkpoints/<model>/step-<N>/`) holds an HF model directory beside the
trainer's own state (optimizer, scheduler, `trainer_state.json`). Export copies the first, or with
`--dtype` saves the weights in that dtype. A LoRA checkpoint is merged into its base (peft's
`merge_and_unload`), or with `--adapter` copied as it is. `swarmrl_export.json` says which run,
model, step and policy version the weights are.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

TRAINER_ONLY = ("optimizer-rank", "scheduler-rank", "trainer_state.json")
"""Checkpoint files that only a resumed trainer reads (prefixes)."""
DTYPES = ("bf16", "fp16", "fp32")
PROVENANCE = "swarmrl_export.json"


class ExportError(Exception):
    """Why a run's model cannot be exported (the message says what to give instead)."""


def find_checkpoint(run_dir: Path, model: str, step: int | None) -> tuple[int, Path]:
    """The checkpoint of `model` in `run_dir`: step `step`, or the newest."""
    from swarmrl.services.trainer.checkpoint import checkpoint_root, list_checkpoints

    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        raise ExportError(f"{run_dir} has no checkpoints/ folder: is it a run directory of `swarmrl up`?")
    found = list_checkpoints(checkpoint_root(run_dir, model))
    if not found:
        models = sorted(p.name for p in root.iterdir() if list_checkpoints(p))
        raise ExportError(f"no checkpoint of model {model!r} in {run_dir}; models with checkpoints: {models}")
    if step is None:
        return found[-1]
    if step in (kept := dict(found)):
        return step, kept[step]
    raise ExportError(
        f"{model!r} has no checkpoint of step {step} in {run_dir}; kept: {[n for n, _ in found]}"
    )


def export(
    run_dir: Path,
    model: str,
    to: Path,
    dtype: str | None = None,
    step: int | None = None,
    force: bool = False,
    adapter: bool = False,
) -> Path:
    """Write `model`'s checkpoint of `run_dir` to `to` as an HF model directory (`adapter`: a LoRA
    model's adapter directory as trained); return `to`."""
    from swarmrl.services.trainer import checkpoint as ckpt

    n, checkpoint = find_checkpoint(run_dir, model, step)
    if to.exists() and any(to.iterdir()) and not force:
        raise ExportError(f"{to} is not empty; give another directory or --force to overwrite")
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    lora = (checkpoint / ckpt.ADAPTER_CONFIG).is_file()
    if adapter and not lora:
        raise ExportError(
            f"--adapter: {model!r} trained all its weights (no {ckpt.ADAPTER_CONFIG} in {checkpoint})"
        )
    if adapter and dtype is not None:
        raise ExportError("--adapter copies the adapter as trained; leave out --dtype")
    to.mkdir(parents=True, exist_ok=True)
    merge = lora and not adapter
    if dtype is None and not merge:  # as trained: the files themselves, bit for bit
        for p in checkpoint.iterdir():
            if p.is_file() and not p.name.startswith(TRAINER_ONLY):
                shutil.copy2(p, to / p.name)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype or "fp32"]
        if merge:
            from peft import AutoPeftModelForCausalLM

            peft_model = AutoPeftModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
            weights = peft_model.merge_and_unload().to(torch_dtype)
        else:
            weights = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype)
        weights.save_pretrained(to)
        ckpt.copy_tokenizer_files(checkpoint, to)
        # .json/.md files that copy_tokenizer_files keeps and a plain model directory does not have
        for name in (ckpt.STATE_FILE, *((ckpt.ADAPTER_CONFIG, "README.md") if merge else ())):
            (to / name).unlink(missing_ok=True)
    state = ckpt.TrainerState.read(checkpoint)
    provenance = {
        "run_dir": str(Path(run_dir).resolve()), "model": model, "step": n, "policy_version": state.version,
        "dtype": dtype or ("fp32" if merge else "as trained"),
        "lora": "adapter" if adapter else ("merged" if lora else None),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }  # fmt: skip
    (to / PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")
    return to


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swarmrl export",
        description="Write a trained model of a run as an HF model directory (weights, config, tokenizer, "
        "chat template) that transformers, vLLM and SGLang load as they are.",
    )
    p.add_argument("run", type=Path, help="the run directory (as `swarmrl up --run-dir`, e.g. runs/latest)")
    p.add_argument("--model", required=True, help="the model's name in the run's description (e.g. policy)")
    p.add_argument("--to", type=Path, required=True, help="directory to write (created; must be empty)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="save the weights in this dtype (default: as trained, the checkpoint's files copied)")  # fmt: skip
    p.add_argument("--step", type=int, default=None, help="a kept checkpoint's step (default: the newest)")
    p.add_argument("--force", action="store_true", help="write into a directory that is not empty")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA model: copy its adapter as trained instead of merging it into the base")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = export(args.run, args.model, args.to, args.dtype, args.step, args.force, args.adapter)
    except ExportError as exc:
        print(f"swarmrl export: {exc}", file=sys.stderr)
        return 2
    info = json.loads((out / PROVENANCE).read_text())
    print(f"swarmrl export: {args.model} step {info['step']} (policy v{info['policy_version']}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
