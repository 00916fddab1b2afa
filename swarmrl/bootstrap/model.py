"""Builds swarmrl's tiny offline models: tokenizer + a standard Qwen2 or Llama causal LM
(`presets.PRESETS`), SFT warm-started on its sources, saved as a plain HF model directory
(safetensors, tokenizer, chat template, generation config, meta.json).

Nothing downstream may assume this model: everything loads it with `AutoModelForCausalLM` /
`AutoTokenizer`, exactly like a real Qwen2.5-Instruct directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from swarmrl.bootstrap.presets import (
    BUILDER_VERSION,
    DEFAULT_PRESET,
    TinyDims,
    default_steps,
    get_preset,
    resolve_sources,
)
from swarmrl.bootstrap.sft import warm_start
from swarmrl.bootstrap.tokenizer import IM_END, VOCAB_SIZE, build_tokenizer

_ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


def build_model(
    out_dir: str | Path,
    seed: int = 0,
    warm_start_steps: int | None = None,
    progress: bool = True,
    dims: TinyDims | None = None,
    batch_size: int = 16,
    preset: str = DEFAULT_PRESET,
    sources: Sequence[str] | None = None,
    vocab_size: int = VOCAB_SIZE,
) -> Path:
    """Build, warm-start and save a tiny model into `out_dir`; the same seed gives the same weights.
    `warm_start_steps` 0 leaves a random init (fast, for tests), None is `presets.default_steps`;
    `dims` and `sources` default to the preset's. Another `vocab_size` gives another vocabulary
    (a team of models with different tokenizers, as users bring)."""
    started = time.monotonic()
    spec = get_preset(preset)
    resolved = resolve_sources(preset, sources)
    steps = default_steps(preset, resolved) if warm_start_steps is None else warm_start_steps
    dims = dims or spec.dims
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, seed=seed, vocab_size=vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config_class, model_class = _ARCHITECTURES[spec.architecture]
    config = config_class(
        vocab_size=len(tokenizer),  # exact: a padded vocab could sample ids the tokenizer lacks
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
        **asdict(dims),
    )
    torch.manual_seed(seed)
    model: PreTrainedModel = model_class(config)
    losses = warm_start(model, tokenizer, steps, seed, batch_size, progress=progress, sources=list(resolved))
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    tail = losses[-10:]
    meta = {
        "builder_version": BUILDER_VERSION,
        "preset": preset,
        "architecture": spec.architecture,
        "sources": list(resolved),
        "seed": seed,
        "warm_start_steps": steps,
        "batch_size": batch_size,
        "final_sft_loss": sum(tail) / len(tail) if tail else None,
        "param_count": sum(p.numel() for p in model.parameters()),
        "build_time_s": round(time.monotonic() - started, 2),
        "dims": asdict(dims),
        "vocab_size": len(tokenizer),
        "torch": torch.__version__,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out
