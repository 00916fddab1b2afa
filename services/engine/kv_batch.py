"""The running batch of the embedded engine: rows that decode together over one left-padded KV cache.

Consumes: prefilled rows (their HF `DynamicCache` and attention mask) to join, and the indices of
rows to keep after each step. Publishes nothing; pure tensor bookkeeping for `engine_core`.

Layout: every row's cache is right-aligned at the same length; `mask[i, j] == 0` marks column j as
padding for row i. Joining pads the shorter side on the left; retiring rows drops them and then any
leading columns that are padding for every remaining row, so the cache never keeps dead columns.
Only plain `DynamicLayer`s (full attention) are handled; the engine creates its caches that way.
"""

from __future__ import annotations

import inspect
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

    def join(self, pieces: list[tuple[list[R], DynamicCache, torch.Tensor]]) -> None:
        """Append freshly prefilled rows (one piece per prefill forward: its rows, cache and mask),
        left-padding every cache to the longest; the running batch's cache is copied once."""
        if self.cache is not None and self.rows:
            pieces = [(self.rows, self.cache, self.mask), *pieces]
        self.rows = [row for rows, _, _ in pieces for row in rows]
        if len(pieces) == 1:
            _, self.cache, self.mask = pieces[0]
            return
        width = max(mask.shape[1] for _, _, mask in pieces)
        pads = [(0, 0, width - mask.shape[1], 0) for _, _, mask in pieces]  # the seq dim, on the left
        joined = pieces[0][1]
        for layers in zip(*(_layers(cache) for _, cache, _ in pieces), strict=True):
            kvs = [_kv(layer) for layer in layers]  # [batch, heads, seq, head_dim] each
            layers[0].keys = torch.cat([pad(k, n) for (k, _), n in zip(kvs, pads, strict=True)])
            layers[0].values = torch.cat([pad(v, n) for (_, v), n in zip(kvs, pads, strict=True)])
        self.mask = torch.cat([pad(mask, (n[2], 0)) for (_, _, mask), n in zip(pieces, pads, strict=True)])
        self.cache = joined

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


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: transformers 5.x renamed
    `past_key_values` to `cache` (the old name goes in 5.40); the versions before know only the old one."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
