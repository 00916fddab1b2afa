"""Which precision a model runs and trains in by default: bf16 for real models, fp32 for tiny ones.

For models of 100M parameters and more bf16 pays on this project's CPUs (`bench/results/real-model.md`);
tiny models gain nothing from it, and it would only move the engine's logprobs away from an fp32
trainer's. An explicit dtype or `mixed_precision` setting always wins. Reads safetensors headers only.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

BF16_MIN_PARAMETERS = 100_000_000
"""Models with at least this many parameters run in bf16 when their precision is `auto`."""


def parameter_count(model_dir: str | Path) -> int:
    """Parameters stored in a model directory's `*.safetensors` files, read from their headers."""
    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return total


def auto_bf16(model_dir: str | Path) -> bool:
    """Whether a model whose precision is `auto` runs in bf16."""
    return parameter_count(model_dir) >= BF16_MIN_PARAMETERS


def resolve_dtype(dtype: str, model_dir: str | Path) -> str:
    """An engine's `dtype` setting made concrete: `auto` is bfloat16 or float32 by `auto_bf16`."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if auto_bf16(model_dir) else "float32"


def resolve_mixed_precision(setting: str | None, model_dir: str | Path) -> str | None:
    """A trainer's `mixed_precision` made concrete: `auto` is `bf16` or `no` by `auto_bf16`; None
    stays None (Accelerate's own launch configuration decides)."""
    if setting != "auto":
        return setting
    return "bf16" if auto_bf16(model_dir) else "no"
