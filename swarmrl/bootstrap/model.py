"""Builds swarmrl's tiny offline model: tokenizer + a standard Qwen2ForCausalLM (a few million
parameters), an SFT warm start on the default tasks, saved as a plain HF model directory
(safetensors, tokenizer, chat template, generation config, meta.json).

Nothing downstream may assume this model: everything loads it with `AutoModelForCausalLM` /
`AutoTokenizer`, exactly like a real Qwen2.5-Instruct directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from swarmrl.bootstrap.sft import warm_start
from swarmrl.bootstrap.tokenizer import IM_END, build_tokenizer

# Bump when the tokenizer, architecture, tasks or warm start change: it names the cache directory.
BUILDER_VERSION = "2"
DEFAULT_STEPS = 1250


@dataclass(frozen=True)
class TinyDims:
    """Model dimensions: small enough that a CPU SFT step takes well under a second."""

    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048


def build_model(
    out_dir: str | Path,
    seed: int = 0,
    warm_start_steps: int = DEFAULT_STEPS,
    progress: bool = True,
    dims: TinyDims = TinyDims(),
    batch_size: int = 16,
) -> Path:
    """Build, warm-start and save the tiny model.

    Args:
        out_dir: target directory (created; files in it are overwritten).
        seed: seeds the tokenizer corpus, the init and the demonstrations; same seed, same weights.
        warm_start_steps: SFT steps on demonstrations; 0 leaves a random init (fast, for tests).
        progress: show a rich progress bar over SFT steps.
        dims: model dimensions.
        batch_size: demonstrations per SFT step.

    Returns:
        `out_dir` as a Path, loadable with `AutoModelForCausalLM.from_pretrained`.
    """
    started = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, seed=seed)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),  # exact: a padded vocab could sample ids the tokenizer lacks
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
        **asdict(dims),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    losses = warm_start(
        model, tokenizer, warm_start_steps, seed=seed, batch_size=batch_size, progress=progress
    )
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    tail = losses[-10:]
    meta = {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "warm_start_steps": warm_start_steps,
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


def swarmrl_home() -> Path:
    """`$SWARMRL_HOME`, else `~/.cache/swarmrl`."""
    return Path(os.environ.get("SWARMRL_HOME") or Path.home() / ".cache" / "swarmrl")


def _source_digest() -> str:
    """Hash of the code the model is built from (this package and the default tasks): a cached model
    built from other task prompts or demonstrations would silently be the wrong policy."""
    import swarmrl.agents.tasks as tasks_pkg

    h = hashlib.sha256()
    for folder in (Path(__file__).parent, Path(tasks_pkg.__file__).parent):
        for f in sorted(folder.glob("*.py")):
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def default_model_dir(seed: int = 0, steps: int = DEFAULT_STEPS) -> Path:
    """Where the default tiny model lives; the name changes with the builder version, its inputs and
    the source of the builder and the tasks."""
    digest = hashlib.sha256(f"{BUILDER_VERSION}:{seed}:{steps}:{_source_digest()}".encode()).hexdigest()[:10]
    return swarmrl_home() / "models" / f"tiny-{digest}"


def ensure_default_model(
    seed: int = 0, steps: int = DEFAULT_STEPS, progress: bool = True, force: bool = False
) -> Path:
    """The default model directory, built first when missing (or when `force`).

    Builds into a temporary sibling and renames it into place, so concurrent callers never see a
    half-written model and the loser of a race just discards its copy.
    """
    target = default_model_dir(seed, steps)
    if (target / "meta.json").exists() and not force:
        return target
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_model(tmp, seed=seed, warm_start_steps=steps, progress=progress)
    if force:
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first: its copy is equivalent (same seed)
        shutil.rmtree(tmp, ignore_errors=True)
    return target
