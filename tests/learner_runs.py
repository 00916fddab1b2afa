"""Train the tiny model for a few GRPO steps in this process and write down what happened.

Run as `python -m tests.learner_runs MODEL_DIR OUT_DIR DEVICE PRECISION LAYOUT...`, one process
per (device, mixed precision): Accelerate's state is process-wide, so a CPU and a CUDA learner, or an
fp32 and a bf16 one, cannot share a process (`tests/gpu/test_learner_gpu.py`). Under `accelerate
launch` with N processes each trains its shard of every step, as the trainer service does, and
process 0 writes the results (`tests/integration/test_trainer_processes.py`). For each layout
(`shared`: prefix trees, `packed`: side by side; `shared-lora`: prefix trees, a rank-4 LoRA
adapter trained instead of all weights) a fresh learner from the same weights and seed
takes `STEPS` steps over the same samples; `OUT_DIR/<layout>.safetensors` gets its final weights and
`OUT_DIR/result.json` its statistics and logprobs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from swarmrl.services.trainer.batching import MicroBatch, Scored, pack, pack_shared
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import Learner
from tests.unit.trainer.test_prefix_sharing import SHAPES

STEPS = 2
MAX_TOKENS = 64
"""Rows of 64 tokens: each layout makes several micro-batches, so gradients accumulate across them."""


BEHAVIOUR = -6.6
"""Behaviour logprob of every generated token: near the tiny model's own (-6.1 to -7.2), so the PPO
ratios straddle the clip range and a step has clipped and unclipped tokens."""


def items() -> list[Scored]:
    """A GRPO group (one prompt, four answers) and an episode's nested timelines: the samples of
    `test_prefix_sharing.test_a_step_trains_the_same_either_way`."""
    rng = torch.Generator().manual_seed(5)
    out = []
    for it in SHAPES["group"](rng) + SHAPES["nested"](rng):
        behaviour = [BEHAVIOUR if m else 0.0 for m in it.sample.loss_mask]
        out.append(Scored(it.sample.model_copy(update={"logprobs": behaviour}), it.advantage))
    return out


def per_sample(learner: Learner, mbs: list[MicroBatch]) -> dict[str, list[float]]:
    """Each sample's trained-token logprobs under the learner's model, by sample id."""
    out: dict[str, list[float]] = {}
    by_id = {it.sample.sample_id: it.sample for it in items()}
    for mb in mbs:
        lp = learner._logprobs(learner.model, mb).float().cpu().tolist()
        for sid in mb.sample_ids:
            n = sum(by_id[sid].loss_mask[1:])
            out[sid], lp = lp[:n], lp[n:]
        assert not lp, f"{len(lp)} logprobs left over in a row of {mb.sample_ids}"
    return out


def run(model_dir: str, out_dir: Path, device: str, precision: str, layout: str) -> dict[str, object]:
    cfg = TrainerConfig(
        model_path=model_dir, run_dir=str(out_dir / "run"), lr=1e-3, max_tokens_per_micro_batch=MAX_TOKENS,
        prefix_sharing=layout.startswith("shared"), mixed_precision=precision,
        lora_rank=4 if layout.endswith("-lora") else 0,
    )  # fmt: skip
    learner = Learner(cfg, model_dir)
    acc = learner.accelerator
    assert acc.device.type == torch.device(device).type, f"asked for {device}, Accelerate chose {acc.device}"
    assert acc.mixed_precision == precision, (acc.mixed_precision, precision)
    scored = items()
    alone = per_sample(learner, [pack([it], MAX_TOKENS)[0] for it in scored])
    rows = (pack_shared if cfg.prefix_sharing else pack)(scored, MAX_TOKENS)
    before = per_sample(learner, rows)
    stats = [learner.train_step(learner.shard(scored), version=0).stats for _ in range(STEPS)]
    model = acc.unwrap_model(learner.model)  # DDP wraps it under several processes
    weights = {n: p.detach().float().cpu().contiguous() for n, p in model.named_parameters()}
    if learner.is_main:
        save_file(weights, str(out_dir / f"{layout}.safetensors"))
    return {
        "processes": acc.num_processes,
        "device": str(acc.device),
        "mixed_precision": acc.mixed_precision,
        "dtypes": sorted({str(p.dtype) for p in learner.model.parameters()}),
        "rows": len(rows),
        "alone": alone,
        "before": before,
        "stats": stats,
    }


def main(argv: list[str]) -> None:
    model_dir, out, device, precision, *layouts = argv
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {layout: run(model_dir, out_dir, device, precision, layout) for layout in layouts}
    if int(os.environ.get("RANK", "0")) == 0:
        (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
