"""Checkpoint layout on disk (pure file logic):

    <run_dir>/checkpoints/<model>/step-<N>/
        config.json, model.safetensors ...   `save_pretrained`'s (with LoRA: adapter_*), what engines load
        tokenizer files                      copied from the base model directory
        optimizer-rank<R>.pt                 each process's optimizer state (every `optimizer_state_every`)
        trainer_state.json                   TrainerState

A checkpoint is written to `step-<N>.tmp` and renamed when complete.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "trainer_state.json"
ADAPTER_CONFIG = "adapter_config.json"
"""Written by peft's `save_pretrained`: the checkpoint holds a LoRA adapter."""
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
    """Samples trained in this step: their redelivery after a crash is skipped."""
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
    older one that has it."""
    m = _STEP_RE.match(checkpoint.name)
    step = int(m.group(1)) if m else None
    for s, p in reversed(list_checkpoints(checkpoint.parent)):
        if (step is None or s <= step) and has_optimizer(p):
            return p
    return None


def prune(root: Path, keep: int, pinned: int | None = None) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, the step `pinned` (a rollback target) and the
    newest with optimizer state, and `.tmp` leftovers; return what was deleted."""
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
