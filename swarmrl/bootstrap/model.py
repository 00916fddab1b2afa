"""Builds swarmrl's tiny offline models: tokenizer + a standard Qwen2ForCausalLM or LlamaForCausalLM
(a few million parameters, see `presets.PRESETS`), an SFT warm start on the preset's sources (tasks,
or roles of multi-role tasks), saved as a plain HF model directory (safetensors, tokenizer, chat
template, generation config, meta.json). The cache of built models is `presets.ensure_model`.

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
    DEFAULT_STEPS,
    TinyDims,
    default_steps,
    ensure_model,
    get_preset,
    model_dir,
    resolve_sources,
    swarmrl_home,
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
    """Build, warm-start and save a tiny model.

    Args:
        out_dir: target directory (created; files in it are overwritten).
        seed: seeds the tokenizer corpus, the init and the demonstrations; same seed, same weights.
        warm_start_steps: SFT steps on demonstrations; 0 leaves a random init (fast, for tests);
            None = `presets.default_steps(preset, sources)`.
        progress: show a rich progress bar over SFT steps.
        dims: model dimensions; None = the preset's.
        batch_size: demonstrations per SFT step.
        preset: a name in `presets.PRESETS` (architecture and dimensions).
        sources: SFT sources (`calculator`, `team_calculator.caller`); None = the preset's own.
        vocab_size: the tokenizer's target vocabulary (another size gives another vocabulary: a
            team of models with different tokenizers, as users bring).

    Returns:
        `out_dir` as a Path, loadable with `AutoModelForCausalLM.from_pretrained`.

    Raises:
        ValueError: unknown preset or source.
    """
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
    losses = warm_start(
        model,
        tokenizer,
        steps,
        seed=seed,
        batch_size=batch_size,
        progress=progress,
        sources=list(resolved),
    )
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
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
        "param_count": params,
        "build_time_s": round(time.monotonic() - started, 2),
        "dims": asdict(dims),
        "vocab_size": len(tokenizer),
        "torch": torch.__version__,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def default_model_dir(seed: int = 0, steps: int = DEFAULT_STEPS) -> Path:
    """Where the default model (preset `tiny`, its own sources) lives: `presets.model_dir`."""
    return model_dir(DEFAULT_PRESET, None, steps, seed)


def ensure_default_model(
    seed: int = 0, steps: int = DEFAULT_STEPS, progress: bool = True, force: bool = False
) -> Path:
    """The default model directory (preset `tiny`), built first when missing: `presets.ensure_model`."""
    return ensure_model(DEFAULT_PRESET, None, steps, seed, progress=progress, force=force)


__all__ = [
    "BUILDER_VERSION",
    "DEFAULT_STEPS",
    "TinyDims",
    "build_model",
    "default_model_dir",
    "ensure_default_model",
    "swarmrl_home",
]
