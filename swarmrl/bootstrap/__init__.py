"""The offline tiny model: tokenizer + chat template, a small Qwen2 causal LM warm-started on the
default tasks, and an offline evaluator. Nothing here is needed to run swarmrl on a real model."""

from swarmrl.bootstrap.chat_template import CHAT_TEMPLATE
from swarmrl.bootstrap.evaluate import EvalResult, evaluate_offline, parse_assistant_text
from swarmrl.bootstrap.model import (
    BUILDER_VERSION,
    DEFAULT_STEPS,
    TinyDims,
    build_model,
    default_model_dir,
    ensure_default_model,
)
from swarmrl.bootstrap.tokenizer import build_tokenizer

__all__ = [
    "BUILDER_VERSION",
    "CHAT_TEMPLATE",
    "DEFAULT_STEPS",
    "EvalResult",
    "TinyDims",
    "build_model",
    "build_tokenizer",
    "default_model_dir",
    "ensure_default_model",
    "evaluate_offline",
    "parse_assistant_text",
]
