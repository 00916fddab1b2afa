"""Weight reloads of the embedded engine: full weights from a checkpoint, or a LoRA adapter.

The tensors are read and checked in the caller's thread while decoding goes on; the scheduler applies
them when no request runs (`_apply_swap`), so every output comes from one version. A failed check or
copy leaves the served weights as they were and says why.
"""

from __future__ import annotations

import logging
import queue
from typing import Any

import torch

from swarmrl.services.engine import model_dir
from swarmrl.services.engine.lora import Merged, peft_load
from swarmrl.services.engine.prefix_cache import PrefixCache
from swarmrl.services.engine.rows import Swap

log = logging.getLogger("swarmrl.engine.core")

FLUSH = object()
"""A queue item: drop the prefix cache before the next admission."""


class Reloads:
    """`EngineCore`'s weight reloads; the attributes below are the engine's."""

    model: Any
    base: torch.nn.Module
    model_path: str
    device: torch.device
    weight_version: str
    adapter_versions: dict[str, str]
    _merged: Merged | None
    _prefix: PrefixCache
    _queue: queue.Queue[Any]

    def check_adapter(self, adapter: str | None) -> None:
        """ValueError unless `adapter` is None (the base) or one of the engine's adapters."""
        if adapter is None and self._merged is not None:
            (only,) = self.adapter_versions
            raise ValueError(
                f"this engine serves LoRA adapter {only!r} merged into its weights (merge_lora): name it "
                "(lora_path); an engine with merge_lora = false serves the base beside it"
            )
        if adapter is not None and adapter not in self.adapter_versions:
            served = sorted(self.adapter_versions) or "none"
            raise ValueError(f"unknown LoRA adapter {adapter!r}; this engine serves adapters: {served}")

    def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None
    ) -> tuple[bool, str]:
        """Load safetensors from `model_path` into the live model between batches (blocking). Without
        `weight_version`, a numeric version is bumped by one."""
        if self.adapter_versions:
            return False, (
                f"this engine serves LoRA adapters {sorted(self.adapter_versions)} of its base "
                f"{self.model_path}: load adapters (`/load_lora_adapter`), not full weights"
            )
        try:
            tensors = model_dir.load_checked(self.model, model_path)
        except (OSError, ValueError) as exc:
            return False, f"failed to load weights from {model_path}: {exc}"
        return self._wait_swap(Swap(str(model_path), tensors, weight_version), "weights")

    def load_lora_adapter(self, name: str, path: str, weight_version: str | None = None) -> tuple[bool, str]:
        """Load (or replace in place) LoRA adapter `name` from a peft adapter directory between
        batches (blocking), as `update_weights_from_disk` does for full weights."""
        from peft import LoraConfig
        from peft.utils import load_peft_weights

        try:
            self.check_adapter(name)
            config = LoraConfig.from_pretrained(path)
            tensors = load_peft_weights(path, device=str(self.device))
        except (OSError, ValueError) as exc:
            return False, f"failed to load LoRA adapter {name!r} from {path}: {exc}"
        swap = Swap(str(path), tensors, weight_version, adapter=name, lora_config=config)
        return self._wait_swap(swap, f"LoRA adapter {name!r}")

    def flush_cache(self) -> None:
        """Drop the prefix cache (SGLang's `/flush_cache`); takes effect before the next admission."""
        self._queue.put(FLUSH)

    def _wait_swap(self, swap: Swap, what: str) -> tuple[bool, str]:
        self._queue.put(swap)
        try:
            version = swap.done.result()
        except Exception as exc:  # the scheduler reports why the copy did not happen
            return False, f"failed to apply {what} from {swap.path}: {exc}"
        return True, f"loaded {what} from {swap.path}; weight_version={version}"

    def _apply_swap(self, swap: Swap) -> None:
        name = swap.adapter
        try:
            if name is None:
                model_dir.copy_into(self.model, swap.tensors)
            elif self._merged is not None:
                self._merged.load(swap.tensors, swap.lora_config)
            else:
                self.model = peft_load(self.model, self.base, name, swap.tensors, swap.lora_config)
        except Exception as exc:  # reported to the caller; the engine keeps serving what it had
            swap.done.set_exception(exc)
            return
        self._prefix.clear()  # every cached prefix was computed by the old weights
        old = self.weight_version if name is None else self.adapter_versions[name]
        if swap.version is not None:
            version = str(swap.version)
        else:  # a numeric version is bumped by one
            version = str(int(old) + 1) if old.isdigit() else old
        if name is None:
            self.weight_version, self.model_path = version, swap.path
        else:
            self.adapter_versions[name] = version
        what = "weights" if name is None else f"LoRA adapter {name}"
        log.info("%s reloaded from %s weight_version=%s", what, swap.path, version)
        swap.done.set_result(version)
