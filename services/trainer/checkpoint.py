"""Checkpoint layout on disk (pure file logic, no NATS, no torch).

    <run_dir>/checkpoints/<model>/step-<N>/
        config.json, model.safetensors ...   written by `save_pretrained` (what engines load), or with
                                             LoRA adapter_config.json, adapter_model.safetensors
        tokenizer files                      copied from the base model directory
        optimizer-rank<R>.pt                 optimizer state of each training process (every
                                             `optimizer_state_every` steps: for full weights it is
                                             twice their size)
        trainer_state.json                   TrainerState: step, version, last step's sample ids

A checkpoint is written to `step-<N>.tmp` and renamed when complete, so `latest` never sees a
half-written one.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "trainer_state.json"
ADAPTER_CONFIG = "adapter_config.json"
"""What peft's `save_pretrained` writes beside `adapter_model.safetensors`: a checkpoint of a LoRA adapter."""
_STEP_RE = re.compile(r"^step-(\d+)$")
# Written by save_pretrained (or not wanted): never copied over from the base model directory.
_NOT_TOKENIZER = re.compile(
    r"(\.safetensors|\.bin|\.pt|\.pth|\.index\.json|^config\.json|^generation_config\.json)$"
)


@dataclass
class TrainerState:
    model: str
    step: int
    version: int
    sample_ids: list[str] = field(default_factory=list)
    """Samples trained in this step: if the trainer died before acking them, their redelivery is skipped."""
    counts: dict[str, int] = field(default_factory=dict)
    """Cumulative counters (dropped, dead-lettered, ...) at this step."""

    def write(self, directory: Path) -> None:
        (directory / STATE_FILE).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, directory: Path) -> TrainerState:
        return cls(**json.loads((directory / STATE_FILE).read_text()))


def checkpoint_root(run_dir: str | Path, model: str) -> Path:
    return Path(run_dir) / "checkpoints" / model


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(root: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def has_optimizer(checkpoint: Path) -> bool:
    return any(checkpoint.glob("optimizer-rank*.pt"))


def optimizer_source(checkpoint: Path) -> Path | None:
    """The checkpoint whose optimizer state a resume from `checkpoint` loads: itself, else the newest
    older one that has it (optimizer state is saved every `optimizer_state_every` steps)."""
    m = _STEP_RE.match(checkpoint.name)
    step = int(m.group(1)) if m else None
    for s, p in reversed(list_checkpoints(checkpoint.parent)):
        if (step is None or s <= step) and has_optimizer(p):
            return p
    return None


def prune(root: Path, keep: int, pinned: int | None = None) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (and `.tmp` leftovers), the step `pinned` (a
    rollback target, `guard.py`), and the newest one holding optimizer state; return what was deleted."""
    found = list_checkpoints(root)
    with_state = [step for step, p in found if has_optimizer(p)]
    kept = {pinned, with_state[-1] if with_state else None}
    doomed = [p for step, p in found[: max(0, len(found) - keep)] if step not in kept]
    doomed += list(root.glob("step-*.tmp"))  # a crash mid-save; only this process writes here
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def copy_tokenizer_files(src: str | Path, dst: Path) -> None:
    """Copy tokenizer/chat-template files so a checkpoint directory is a complete HF model dir."""
    for p in Path(src).iterdir():
        if p.is_file() and not _NOT_TOKENIZER.search(p.name):
            shutil.copy2(p, dst / p.name)
