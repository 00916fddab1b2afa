"""LoRA adapters in the embedded engine, loaded by its scheduler thread between batches.

- `Merged`: an engine serving one adapter only (`merge_lora`) adds it into the base weights,
  W = W0 + (alpha / r) B A, always from the base weights kept at the first load, so nothing drifts
  and decoding costs what the base's does. Requests must name the adapter: the base is gone.
- `peft_load`: several adapters (or `merge_lora` off) run through peft's mixed-adapter forward.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch


class Merged:
    """One adapter merged into `model`'s weights, re-merged from the base on every load."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.base: dict[str, torch.Tensor] = {}
        """Module name -> its weight before any adapter, for the modules an adapter has touched."""
        self.shape: tuple[int, float, tuple[str, ...]] | None = None

    @torch.no_grad()
    def load(self, tensors: dict[str, torch.Tensor], config: Any) -> None:
        """Merge the adapter (`tensors` keyed as peft saves them); ValueError, changing nothing, if it
        does not fit the model or cannot be merged."""
        if getattr(config, "use_dora", False) or getattr(config, "modules_to_save", None):
            raise ValueError(
                "a DoRA adapter or one with modules_to_save cannot be merged; set merge_lora = false"
            )
        rank = math.sqrt(config.r) if getattr(config, "use_rslora", False) else config.r
        scale = config.lora_alpha / rank
        pairs = _pairs(tensors)
        weights: dict[str, torch.Tensor] = {}
        for name, (a, b) in pairs.items():
            weight = getattr(self.model.get_submodule(name), "weight", None)
            expected = (b.shape[0], a.shape[1]) if a.shape[0] == b.shape[1] else None
            if not isinstance(weight, torch.Tensor) or weight.shape != expected:
                raise ValueError(f"adapter tensors for {name} do not fit its weight")
            weights[name] = weight
        shape = (int(config.r), float(scale), tuple(sorted(pairs)))
        if self.shape is not None and shape[::2] != self.shape[::2]:
            raise ValueError(f"adapter changed shape (rank {self.shape[0]} -> {shape[0]}, or its modules)")
        for name, (a, b) in pairs.items():
            if name not in self.base:
                self.base[name] = weights[name].detach().clone()
            delta = b.to(torch.float32) @ a.to(torch.float32)
            weights[name].copy_(torch.add(self.base[name].to(torch.float32), delta, alpha=scale))
        self.shape = shape


def _pairs(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module name -> (A [r, in], B [out, r]) from peft's saved keys (`...q_proj.lora_A.weight`)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.(lora_[AB])\.weight", key)
        if match is None:
            raise ValueError(f"adapter tensor {key!r} is not a LoRA A or B weight")
        out.setdefault(match[1], {})[match[2]] = tensor
    missing = [n for n, ab in out.items() if set(ab) != {"lora_A", "lora_B"}]
    if missing or not out:
        raise ValueError(f"adapter has no complete A/B pair for {missing[:3] or 'any module'}")
    return {n: (ab["lora_A"], ab["lora_B"]) for n, ab in out.items()}


def peft_load(
    model: Any, base: torch.nn.Module, name: str, tensors: dict[str, torch.Tensor], config: Any
) -> Any:
    """Load adapter `name` into peft's wrapper of `base` (made on the first adapter); returns the
    model to run. ValueError if an adapter already loaded under `name` changes shape."""
    from peft import get_peft_model, set_peft_model_state_dict

    if model is base:
        model = get_peft_model(base, config, adapter_name=name).eval()
    elif name not in model.peft_config:
        model.add_adapter(name, config)
    else:
        old = model.peft_config[name]
        shape = (config.r, config.lora_alpha, config.target_modules)
        if (old.r, old.lora_alpha, old.target_modules) != shape:
            raise ValueError(
                f"adapter {name!r} changed shape (rank {old.r} -> {config.r}, alpha "
                f"{old.lora_alpha} -> {config.lora_alpha}, targets); restart the engine for it"
            )
    result: Any = set_peft_model_state_dict(model, tensors, adapter_name=name)
    if result.unexpected_keys:
        raise ValueError(f"adapter tensors match no module: {result.unexpected_keys[:3]}")
    return model
