"""The offline tiny models: tokenizer + chat template, small Qwen2 / Llama causal LMs (`presets`)
warm-started on tasks or roles of multi-role tasks, and an offline evaluator. Nothing here is needed
to run swarmrl on a real model. Each name below is imported from its module on first use, so that
config validation (`presets`) never loads torch, which the builder and the evaluator need.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "presets": (
        "PRESETS",
        "TinyDims",
        "default_model_dir",
        "default_steps",
        "ensure_default_model",
        "ensure_model",
        "model_dir",
        "source_names",
        "validate_base",
    ),
    "evaluate": ("evaluate_offline", "evaluate_team", "parse_assistant_text"),
    "model": ("build_model",),
    "tokenizer": ("build_tokenizer",),
}
_LAZY = {name: f"swarmrl.bootstrap.{module}" for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swarmrl.bootstrap' has no attribute {name!r}")
