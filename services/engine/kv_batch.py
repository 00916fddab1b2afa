"""The running batch of the embedded engine: rows that decode together over one left-padded KV cache.

Consumes: prefilled rows (their HF `DynamicCache` and attention mask) to join, and the indices of
rows to keep after each step. Publishes nothing; pure tensor bookkeeping for `engine_core`.

Layout: every row's cache is right-aligned at the same length; `mask[i, j] == 0` marks column j as
padding for row i. Joining pads the shorter side on the left; retiring rows drops them and then any
leading columns that are padding for every remaining row, so the cache never keeps dead columns.
Only plain `DynamicLayer`s (full attention) are handled; the engine creates its caches that way.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import torch
from torch.nn.functional import pad
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

R = TypeVar("R")


def left_padded(
    prompts: list[list[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, attention mask and position ids for prefilling `prompts` together (pad id 0, masked)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


class KVBatch(Generic[R]):
    """`rows[i]` owns row i of `cache` and `mask`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: list[R] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, rows: list[R], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append freshly prefilled rows, left-padding whichever cache is shorter."""
        if self.cache is None or not self.rows:
            self.rows, self.cache, self.mask = list(rows), cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        old_pad, new_pad = width - self.mask.shape[1], width - mask.shape[1]
        for old, new in zip(_layers(self.cache), _layers(cache), strict=True):
            (ok, ov), (nk, nv) = _kv(old), _kv(new)
            # [batch, heads, seq, head_dim]: pad the seq dim on the left
            old.keys = torch.cat([pad(ok, (0, 0, old_pad, 0)), pad(nk, (0, 0, new_pad, 0))])
            old.values = torch.cat([pad(ov, (0, 0, old_pad, 0)), pad(nv, (0, 0, new_pad, 0))])
        self.mask = torch.cat([pad(self.mask, (old_pad, 0)), pad(mask, (new_pad, 0))])
        self.rows = self.rows + list(rows)

    def grow_mask(self) -> torch.Tensor:
        """Add the column of the token about to be fed to every row; return the mask for the step."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        return self.mask

    def retain(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in order), then cut columns that are padding for all of them."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.clear()
            return
        assert self.cache is not None
        self.rows = [self.rows[i] for i in keep]
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        start = int(self.mask.any(dim=0).long().argmax())
        if start > 0:
            for layer in _layers(self.cache):
                keys, values = _kv(layer)
                layer.keys, layer.values = keys[:, :, start:], values[:, :, start:]
            self.mask = self.mask[:, start:]

    def clear(self) -> None:
        self.rows, self.cache = [], None
        self.mask = self.mask[:0, :0]


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = list(cache.layers)
    if not all(type(layer) is DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise TypeError(f"only full-attention DynamicLayer caches can be batched, got {kinds}")
    return layers  # type: ignore[return-value]  # checked just above


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None, "cache layer used before prefill"
    return layer.keys, layer.values


def row_kv(cache: DynamicCache, mask: torch.Tensor, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row i's keys and values without its padding, `[kv_heads, tokens, head_dim]` per layer (copies)."""
    cols = mask[i].nonzero().squeeze(1)
    return [(k[i][:, cols], v[i][:, cols]) for k, v in map(_kv, _layers(cache))]
