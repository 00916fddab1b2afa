"""Attention over a micro-batch row laid out as a prefix tree (pure torch).

A row (`batching.py`) is a sequence of *segments*, the tokens one sample adds past the prefix it
shares with the sample before it; they attend to that prefix (their ancestors) and causally to each
other. Short rows are attended in one masked attention over the row; longer ones segment by segment,
over `ancestors + segment` keys, so memory is the largest segment's block, not the row's [L, L] (and
on the CPU `flex_attention` has no backward). Registered in transformers' attention registry: models
loaded with `attn_implementation=TREE_ATTENTION` take the row's layout as the `tree=` argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from swarmrl.services.engine.attention import grouped_attention

TREE_ATTENTION = "swarmrl_tree"


@dataclass(frozen=True)
class Segment:
    """Row positions [start, end) added by one sample, and the positions of its shared prefix."""

    start: int
    end: int
    ancestors: torch.Tensor  # [a] row positions (ascending) the segment's tokens attend to before their own

    def to(self, device: torch.device | str) -> Segment:
        return Segment(self.start, self.end, self.ancestors.to(device))


def dense_mask(segments: list[Segment], length: int) -> torch.Tensor:
    """The [L, L] boolean mask (True = attend) the segments stand for."""
    allowed = torch.zeros((length, length), dtype=torch.bool)
    for seg in segments:
        rows = slice(seg.start, seg.end)
        allowed[rows, seg.ancestors] = True
        allowed[rows, rows] = torch.ones(seg.end - seg.start, seg.end - seg.start, dtype=torch.bool).tril()
    return allowed


DENSE_MAX_TOKENS = 1024
"""Rows up to this long are attended in one masked attention: cheaper than a kernel call per short
segment (`bench/results/real-model.md`), bounded by its heads x L x L memory."""


def tree_for(
    segments: list[Segment], length: int, device: torch.device | str
) -> list[Segment] | torch.Tensor:
    """The `tree=` argument for a row: its dense [L, L] mask when the row is short, else its segments."""
    if length <= DENSE_MAX_TOKENS:
        return dense_mask(segments, length).to(device)
    return [seg.to(device) for seg in segments]


def tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    tree: list[Segment] | torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query [1, Hq, L, D], key/value [1, Hkv, L, D] -> [1, L, Hq, D].
    Without `tree` the row is one causal sequence (the model called as a plain causal LM, unpadded)."""
    if tree is None:
        tree = [Segment(0, query.shape[2], torch.zeros(0, dtype=torch.long, device=query.device))]
    if dropout:
        raise ValueError(f"{TREE_ATTENTION} attention has no dropout (RL models train without it)")
    if isinstance(tree, torch.Tensor):  # one masked attention over the whole row
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return grouped_attention(query, key, value, tree, scale), None
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each kv head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    outs = []
    for seg in tree:
        own = slice(seg.start, seg.end)
        q, k, v = query[:, :, own], key[:, :, own], value[:, :, own]
        if seg.ancestors.numel() == 0:
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling))
            continue
        a, m = seg.ancestors.numel(), seg.end - seg.start
        k = torch.cat([key.index_select(2, seg.ancestors), k], dim=2)
        v = torch.cat([value.index_select(2, seg.ancestors), v], dim=2)
        # All ancestors, then causal within the segment.
        mask = torch.ones((m, a + m), dtype=torch.bool, device=query.device).tril(a)
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling))
    out = torch.cat(outs, dim=2)
    if out.shape[2] != query.shape[2]:
        raise ValueError(f"segments cover {out.shape[2]} of the row's {query.shape[2]} positions")
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TREE_ATTENTION, tree_attention)
AttentionMaskInterface.register(TREE_ATTENTION, lambda *args, **kwargs: None)  # `tree` is the mask
