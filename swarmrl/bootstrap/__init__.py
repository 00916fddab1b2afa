"""The offline tiny models: tokenizer + chat template, small Qwen2 / Llama causal LMs (`presets`)
warm-started on tasks or roles of multi-role tasks, and an offline evaluator. Nothing here is needed
to run swarmrl on a real model. The builder and the evaluator (torch) are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from swarmrl.bootstrap.chat_template import CHAT_TEMPLATE
from swarmrl.bootstrap.presets import (
    BUILDER_VERSION,
    DEFAULT_STEPS,
    PRESETS,
    Preset,
    TinyDims,
    default_steps,
    ensure_model,
    model_dir,
    source_names,
    validate_base,
)

if TYPE_CHECKING:
    from swarmrl.bootstrap.evaluate import EvalResult, evaluate_offline, evaluate_team, parse_assistant_text
    from swarmrl.bootstrap.model import build_model, default_model_dir, ensure_default_model
    from swarmrl.bootstrap.tokenizer import build_tokenizer

_LAZY = {
    name: f"swarmrl.bootstrap.{module}"
    for module, names in {
        "evaluate": ("EvalResult", "evaluate_offline", "evaluate_team", "parse_assistant_text"),
        "model": ("build_model", "default_model_dir", "ensure_default_model"),
        "tokenizer": ("build_tokenizer",),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swarmrl.bootstrap' has no attribute {name!r}")


__all__ = [
    "BUILDER_VERSION",
    "CHAT_TEMPLATE",
    "DEFAULT_STEPS",
    "PRESETS",
    "EvalResult",
    "Preset",
    "TinyDims",
    "build_model",
    "build_tokenizer",
    "default_model_dir",
    "default_steps",
    "ensure_default_model",
    "ensure_model",
    "evaluate_offline",
    "evaluate_team",
    "model_dir",
    "parse_assistant_text",
    "source_names",
    "validate_base",
]
