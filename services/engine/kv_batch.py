"""The embedded engine's running batch: rows that decode together over one left-padded KV cache.

Rows are right-aligned at the same length (`mask[i, j] == 0`: column j is padding for row i); when
rows leave, columns that are padding for all the rest are cut. Full-attention layers only, as
`RoomyLayer`s, which write a decode step's token in place (`bench/results/engine-decode.md`).
"""

from __future__ import annotations

import inspect
from typing import Any, Generic, TypeVar

import torch
from torch.nn.functional import pad
from transformers.cache_utils import Cache, DynamicLayer

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


class RoomyLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values are views of buffers with `ROOM` spare
    columns; they are copied into new buffers only when full or replaced from outside."""

    ROOM = 128

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys is None or self.values is None or self.keys.numel() == 0:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        n = key_states.shape[-2]
        end = self._end_in_buffers()
        if end is None or self._buffers is None or end + n > self._buffers[0].shape[2]:
            used = self.keys.shape[2]
            self._buffers = (
                _roomy(self.keys, used + n + self.ROOM),
                _roomy(self.values, used + n + self.ROOM),
            )
            end = used
        keys, values = self._buffers
        keys[:, :, end : end + n] = key_states
        values[:, :, end : end + n] = value_states
        start = end - self.keys.shape[2]
        self.keys, self.values = keys[:, :, start : end + n], values[:, :, start : end + n]
        return self.keys, self.values

    def _end_in_buffers(self) -> int | None:
        """The buffer column just after `keys`/`values` if they are still views of the buffers (maybe
        with leading columns cut off), else None."""
        if self._buffers is None or self.keys is None or self.values is None:
            return None
        for used, buffer in zip((self.keys, self.values), self._buffers, strict=True):
            if used.shape[:2] != buffer.shape[:2] or used.stride() != buffer.stride():
                return None
            offset, column = used.data_ptr() - buffer.data_ptr(), buffer.stride(2) * buffer.element_size()
            if (
                offset < 0
                or offset % column
                or buffer.untyped_storage().data_ptr() != used.untyped_storage().data_ptr()
            ):
                return None
        return offset // column + self.keys.shape[2]


def _roomy(used: torch.Tensor, columns: int) -> torch.Tensor:
    """A buffer of `columns` columns starting with a copy of `used` (`[batch, heads, seq, dim]`)."""
    batch, heads, seq, dim = used.shape
    buffer = used.new_empty(batch, heads, columns, dim)
    buffer[:, :, :seq] = used
    return buffer


def new_cache() -> Cache:
    """An empty KV cache of `RoomyLayer`s, one added per model layer as the first forward fills it."""
    return Cache(layer_class_to_replicate=RoomyLayer)


class KVBatch(Generic[R]):
    """`rows[i]` owns row i of `cache` and `mask`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: list[R] = []
        self.cache: Cache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, pieces: list[tuple[list[R], Cache, torch.Tensor]]) -> None:
        """Append prefilled rows (a piece per prefill forward: its rows, cache and mask), left-padding
        every cache to the longest."""
        if self.cache is not None and self.rows:
            pieces = [(self.rows, self.cache, self.mask), *pieces]
        self.rows = [row for rows, _, _ in pieces for row in rows]
        if len(pieces) == 1:
            _, self.cache, self.mask = pieces[0]
            return
        width = max(mask.shape[1] for _, _, mask in pieces)
        pads = [(0, 0, width - mask.shape[1], 0) for _, _, mask in pieces]  # the seq dim, on the left
        for layers in zip(*(_layers(cache) for _, cache, _ in pieces), strict=True):
            kvs = [_kv(layer) for layer in layers]  # [batch, heads, seq, head_dim] each
            layers[0].keys = torch.cat([pad(k, n) for (k, _), n in zip(kvs, pads, strict=True)])
            layers[0].values = torch.cat([pad(v, n) for (_, v), n in zip(kvs, pads, strict=True)])
        self.mask = torch.cat([pad(mask, (n[2], 0)) for (_, _, mask), n in zip(pieces, pads, strict=True)])
        self.cache = pieces[0][1]  # its layers now hold every piece's rows

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


def _layers(cache: Cache) -> list[DynamicLayer]:
    layers = list(cache.layers)
    if not all(type(layer) in (DynamicLayer, RoomyLayer) for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise TypeError(f"only full-attention caches (DynamicLayer, RoomyLayer) can be batched, got {kinds}")
    return layers  # type: ignore[return-value]  # checked just above


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None, "cache layer used before prefill"
    return layer.keys, layer.values


def past_cache(hits: list[tuple[int, Any]], device: torch.device) -> tuple[Cache, torch.Tensor]:
    """A prefill's starting cache from prefix-cache hits (tokens, their per-layer KV), right-aligned
    as `KVBatch` keeps rows, and its attention mask (a row without a hit is all padding)."""
    cache = new_cache()
    width = max(n for n, _ in hits)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n, _ in hits], device=device)
    if width == 0:
        return cache, mask
    some = next(kv for n, kv in hits if n)
    for layer, (k0, v0) in enumerate(some):
        keys, values = [], []
        for n, kv in hits:
            k, v = kv[layer] if n else (k0[:, :0], v0[:, :0])
            keys.append(pad(k, (0, 0, width - n, 0)))
            values.append(pad(v, (0, 0, width - n, 0)))
        cache.update(torch.stack(keys), torch.stack(values), layer)
    return cache, mask


def row_kv(cache: Cache, mask: torch.Tensor, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row i's keys and values without its padding, `[kv_heads, tokens, head_dim]` per layer (copies)."""
    cols = mask[i].nonzero().squeeze(1)
    return [(k[i][:, cols], v[i][:, cols]) for k, v in map(_kv, _layers(cache))]


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` in transformers 5.x, before it
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
