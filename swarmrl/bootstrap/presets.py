"""Bootstrap presets: the tiny offline models swarmrl can build, and what they are warm-started on.

A preset is an architecture and its size. A model is a preset warm-started on a list of SFT
*sources*, each a single-agent task (`calculator`) or one role of a multi-role task
(`team_calculator.caller`), so two models can learn two roles. Built models are cached under
`$SWARMRL_HOME/models/` (`ensure_model`). No torch here: config validators call `validate_base`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import swarmrl.agents.tasks as tasks_pkg
from swarmrl.agents.tasks import TASKS
from swarmrl.core.rundir import swarmrl_home

# Bump when the tokenizer, architecture, tasks or warm start change: it names the cache directory.
BUILDER_VERSION = "2"
DEFAULT_PRESET = "tiny"
DEFAULT_STEPS = 1250
SFT_ROUNDS = 250
"""SFT steps per batch of one round over the sources (`default_steps`)."""


@dataclass(frozen=True)
class TinyDims:
    """Model dimensions: small enough that a CPU SFT step takes well under a second."""

    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048


@dataclass(frozen=True)
class Preset:
    """One buildable tiny model family."""

    name: str
    """Registry name, also the prefix of its cache directories."""
    architecture: str
    """`qwen2` (Qwen2ForCausalLM) or `llama` (LlamaForCausalLM)."""
    dims: TinyDims
    description: str
    # The default model's sources are pinned, so its weights don't change when tasks are added.
    sources: tuple[str, ...] = ("calculator", "guess_number")
    """The SFT sources used when none are given."""
    steps: int = DEFAULT_STEPS
    """SFT steps on the preset's own sources (other sources: `default_steps`)."""


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny", "qwen2", TinyDims(), "Qwen2, hidden 192, 4 layers, 4 heads (2 kv), ~1.8M params"),
        Preset(
            "tiny-llama",
            "llama",
            TinyDims(hidden_size=128, intermediate_size=384, num_hidden_layers=3),
            "Llama, hidden 128, 3 layers, 4 heads (2 kv), ~0.7M params",
        ),
        Preset(
            "tiny-h32",
            "qwen2",
            TinyDims(num_attention_heads=6),
            "Qwen2 as `tiny`, 6 heads of 32 (2 kv): a head size vLLM's CPU build serves, ~1.8M params",
        ),
    )
}


def source_names() -> list[str]:
    """Every valid SFT source: single-agent task names and `<task>.<role>` for multi-role tasks."""
    names: list[str] = []
    for name, spec in sorted(TASKS.items()):
        names += [f"{name}.{role}" for role in spec.roles] if spec.roles else [name]
    return names


def parse_source(source: str) -> tuple[str, str | None]:
    """`calculator` -> ("calculator", None); `team_calculator.caller` -> ("team_calculator", "caller").
    A ValueError lists the valid sources."""
    if source not in source_names():
        spec = TASKS.get(source)
        multi_role = spec is not None and spec.roles
        hint = f" ({source} is a multi-role task: name one of its roles)" if multi_role else ""
        raise ValueError(f"unknown SFT source {source!r}{hint}; valid sources: {', '.join(source_names())}")
    task, _, role = source.partition(".")
    return task, role or None


def get_preset(name: str) -> Preset:
    """The preset called `name`; the error lists the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def resolve_sources(preset: str, sources: Sequence[str] | None = None) -> tuple[str, ...]:
    """The SFT sources of a model: `sources` validated (order kept: it seeds the demo stream), or the
    preset's own when None. A ValueError names an unknown preset or source, or a repeated one."""
    p = get_preset(preset)
    if sources is None:
        return p.sources
    if isinstance(sources, str):  # "a,b" from a flag or config: a string is a sequence of letters
        sources = [s.strip() for s in sources.split(",") if s.strip()]
    if not sources:
        raise ValueError(
            f"empty SFT sources for preset {preset!r}; valid sources: {', '.join(source_names())}"
        )
    for source in sources:
        parse_source(source)
    repeated = sorted(s for s, count in Counter(sources).items() if count > 1)
    if repeated:
        raise ValueError(f"SFT sources named twice: {repeated} (in {list(sources)})")
    return tuple(sources)


def validate_base(preset: str, sources: Sequence[str] | None = None) -> None:
    """Check a preset name and its SFT sources without building anything (ValueError if bad)."""
    resolve_sources(preset, sources)


def sft_weight(source: str) -> int:
    """Batches per SFT round of one view of `source`: its task's `sft_weight` or its role's."""
    task, role = parse_source(source)
    spec = TASKS[task]
    return spec.role_sft_weights.get(role, spec.sft_weight) if role else spec.sft_weight


def default_steps(preset: str, sources: Sequence[str] | None = None) -> int:
    """SFT steps when none are asked for: the preset's own for its own sources, else `SFT_ROUNDS`
    rounds of `sft_weight` batches per source, twice for a source with tools (shown with and
    without the tool specs)."""
    resolved = resolve_sources(preset, sources)
    if resolved == get_preset(preset).sources:
        return get_preset(preset).steps
    batches = 0
    for source in resolved:
        task, role = parse_source(source)
        tools = TASKS[task].role_tools.get(role) if role else TASKS[task].tools
        batches += sft_weight(source) * (2 if tools else 1)
    return SFT_ROUNDS * batches


def source_digest() -> str:
    """Hash of the code a model is built from (this package and the tasks), so a cache hit never
    serves a model built from other prompts or demonstrations."""
    h = hashlib.sha256()
    for folder in (Path(__file__).parent, Path(tasks_pkg.__file__).parent):
        for f in sorted(folder.glob("*.py")):
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def model_dir(
    preset: str, sources: Sequence[str] | None = None, steps: int | None = None, seed: int = 0
) -> Path:
    """Where a model lives: `<preset>-<sources joined by +>-<steps>s-seed<seed>-<hash>`, the hash
    also covering the builder version and source code."""
    resolved = resolve_sources(preset, sources)
    steps = default_steps(preset, resolved) if steps is None else steps
    data = ",".join(TASKS[parse_source(s)[0]].fingerprint for s in resolved)  # a dataset task's rows
    key = f"{BUILDER_VERSION}:{preset}:{','.join(resolved)}:{seed}:{steps}:{source_digest()}"
    key += f":{data}" if data.strip(",") else ""  # models warm-started on built-in tasks keep their keys
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return swarmrl_home() / "models" / f"{preset}-{'+'.join(resolved)}-{steps}s-seed{seed}-{digest}"


def ensure_model(
    preset: str,
    sources: Sequence[str] | None = None,
    steps: int | None = None,
    seed: int = 0,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """The model directory of `preset` warm-started on `sources` for `steps` (None: `default_steps`,
    0: random init), built first when missing (or `force`): into a temporary sibling renamed into
    place, so concurrent callers never see a half-written model (the loser of a race drops its copy)."""
    resolved = resolve_sources(preset, sources)
    steps = default_steps(preset, resolved) if steps is None else steps
    if steps < 0:
        raise ValueError(f"SFT steps must be >= 0, got {steps}")
    target = model_dir(preset, resolved, steps, seed)
    if (target / "meta.json").exists() and not force:
        return target
    from swarmrl.bootstrap.model import build_model  # torch: only when a build is needed

    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_model(tmp, seed=seed, warm_start_steps=steps, progress=progress, preset=preset, sources=resolved)
    if force:
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first: its copy is equivalent (same inputs)
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def default_model_dir(seed: int = 0, steps: int = DEFAULT_STEPS) -> Path:
    """Where the default model (preset `tiny`, its own sources) lives."""
    return model_dir(DEFAULT_PRESET, None, steps, seed)


def ensure_default_model(
    seed: int = 0, steps: int = DEFAULT_STEPS, progress: bool = True, force: bool = False
) -> Path:
    """The default model directory (preset `tiny`), built first when missing."""
    return ensure_model(DEFAULT_PRESET, None, steps, seed, progress=progress, force=force)
