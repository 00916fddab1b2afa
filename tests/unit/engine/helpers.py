"""Helpers for the engine tests: sampling params, a perturbed checkpoint, a reference forward pass."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.sampling import SamplingParams


def save_perturbed(src: Path, out: Path, scale: float = 0.05, seed: int = 1) -> Path:
    model = AutoModelForCausalLM.from_pretrained(src)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out)
    return out


def train_adapter(base: Path, out: Path, seed: int, *, lr: float = 1e-2, vocab: int = 500) -> Path:
    """A LoRA adapter (rank 8, every linear layer) three trainer steps away from the base, towards
    random samples with ids below `vocab`, saved in `out` as the trainer saves one."""
    from swarmrl.services.trainer.batching import Scored
    from swarmrl.services.trainer.checkpoint import TrainerState
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner
    from tests.unit.trainer.samples import make_sample

    cfg = TrainerConfig(model_path=str(base), run_dir=str(out.parent), lr=lr, lora_rank=8, seed=seed,
                        max_tokens_per_micro_batch=64)  # fmt: skip
    learner = Learner(cfg, base)
    items = [Scored(make_sample(f"s{seed}-{i}", 1.0, prompt=6, gen=8, vocab=vocab), 1.0) for i in range(4)]
    for _ in range(3):
        learner.train_step(items, version=0)
    learner.save(out, TrainerState("m", 3, 3))
    return out


def params(engine: EngineCore, **kw: object) -> SamplingParams:
    return SamplingParams.from_dict(kw, engine.vocab_size)


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def reference_logprobs(
    engine: EngineCore, prompt: list[int], output: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) at each output token, from one plain full-sequence forward pass
    (on the engine's device; returned on the CPU)."""
    with torch.no_grad():
        ids = torch.tensor([prompt + output], device=engine.device)
        logits = engine.model(input_ids=ids).logits[0].float().cpu()
    steps = logits[len(prompt) - 1 : -1]
    lp = torch.log_softmax(steps / (temperature or 1.0), dim=-1)
    return lp[torch.arange(len(output)), torch.tensor(output)]


def merged_logprobs(base: Path, adapter: Path | None, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log_softmax over the vocabulary at each of `output`'s positions after `prompt`, `[len(output),
    vocab]`, under the base with LoRA `adapter` merged into it (a plain HF forward, fp32, CPU)."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1)
