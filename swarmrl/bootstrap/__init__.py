"""The offline tiny models: tokenizer + chat template, small Qwen2 / Llama causal LMs (`presets`)
warm-started on the default tasks or on roles of multi-role tasks, and an offline evaluator. Nothing
here is needed to run swarmrl on a real model.

The preset catalogue and its checks (`PRESETS`, `validate_base`) import no torch; the builder and
the evaluator are imported on first use of their names.
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
    "EvalResult": "swarmrl.bootstrap.evaluate",
    "evaluate_offline": "swarmrl.bootstrap.evaluate",
    "evaluate_team": "swarmrl.bootstrap.evaluate",
    "parse_assistant_text": "swarmrl.bootstrap.evaluate",
    "build_model": "swarmrl.bootstrap.model",
    "default_model_dir": "swarmrl.bootstrap.model",
    "ensure_default_model": "swarmrl.bootstrap.model",
    "build_tokenizer": "swarmrl.bootstrap.tokenizer",
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
