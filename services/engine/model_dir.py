"""Reading an HF model directory: tokenizer, EOS ids, and safetensors for `update_weights_from_disk`,
checked in full before the first tensor is copied, so a bad checkpoint leaves the weights untouched.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, GenerationConfig

log = logging.getLogger("swarmrl.engine.model_dir")


def load_checked(model: torch.nn.Module, model_path: str | Path) -> dict[str, torch.Tensor]:
    """Every `*.safetensors` tensor of `model_path`, cast to its parameter's dtype; ValueError unless
    they match `model` exactly. Tied aliases (`lm_head.weight`) may be absent; present, they are ignored."""
    root = Path(model_path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {root}")
    loaded: dict[str, torch.Tensor] = {}
    for f in files:
        loaded.update(load_file(str(f)))
    # named_parameters/buffers drop duplicates, so a tied alias is not "required"
    state_keys = set(model.state_dict())
    targets: dict[str, torch.Tensor] = dict(model.named_parameters())
    targets.update((n, b) for n, b in model.named_buffers() if n in state_keys)
    aliases = state_keys - set(targets)
    missing = sorted(set(targets) - set(loaded))
    unexpected = sorted(set(loaded) - set(targets) - aliases)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    out: dict[str, torch.Tensor] = {}
    for name, target in targets.items():
        tensor = loaded[name]
        if tensor.shape != target.shape:
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(target.shape)}"
            )
        out[name] = tensor.to(dtype=target.dtype)
    return out


@torch.no_grad()
def copy_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checked tensors into the model's own storage (so caches of parameter references stay valid)."""
    state = model.state_dict(keep_vars=True)  # the parameters and buffers themselves
    for name, tensor in tensors.items():
        state[name].copy_(tensor)


def load_tokenizer(path: str) -> Any:
    """The tokenizer if the model dir has one; the engine works on token ids without it."""
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("no tokenizer in %s (%s): `text` input and output text are disabled", path, exc)
        return None


def eos_ids(path: str, cfg: Any) -> set[int]:
    """EOS ids from generation_config.json (often a list), falling back to the model config."""
    eos = None
    with contextlib.suppress(OSError):
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    if eos is None:
        eos = getattr(cfg, "eos_token_id", None)
    return {int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos])}
