"""Attention over a micro-batch row laid out as a prefix tree, segment by segment (pure torch).

A row (`batching.py`) is a sequence of *segments*: the tokens one sample adds past the prefix it
shares with the sample before it. A segment's tokens attend to the segment's ancestors (the shared
prefix: row positions earlier in the row, not necessarily contiguous) and causally to each other,
and to nothing else. So attention runs once per segment, over `ancestors + segment` keys, with
`scaled_dot_product_attention`: its memory is that of the largest segment's [m, a + m] block, not
the row's [L, L] (a dense mask at 16k tokens is 1 GiB of float32 per row, and rules out the fused
kernels). A packed row is the same with no ancestors. On the CPU this is also the only exact
sparse route: `flex_attention` has no backward there (torch 2.13).

Plugged into transformers through its public attention registry: the trainer loads its models with
`attn_implementation=TREE_ATTENTION` and passes the row's segments as the `tree=` forward argument,
which transformers hands to every attention call.
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
    ancestors: torch.Tensor
    """[a] row positions (ascending) the segment's tokens attend to before their own."""

    def to(self, device: torch.device | str) -> Segment:
        return Segment(self.start, self.end, self.ancestors.to(device))


def dense_mask(segments: list[Segment], length: int) -> torch.Tensor:
    """The [L, L] boolean mask (True = attend) the segments stand for: for tests and references."""
    allowed = torch.zeros((length, length), dtype=torch.bool)
    for seg in segments:
        rows = slice(seg.start, seg.end)
        allowed[rows, seg.ancestors] = True
        allowed[rows, rows] = torch.ones(seg.end - seg.start, seg.end - seg.start, dtype=torch.bool).tril()
    return allowed


DENSE_MAX_TOKENS = 1024
"""Rows up to this long are attended in one masked attention over the whole row (`tree_for`): on the
CPU, one score matrix per head costs less than a kernel call per segment, which at a GRPO group's
short answers is mostly call overhead (`bench/results/real-model.md`); its memory, heads x L x L, is
what bounds it."""


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

    `tree` is the row's segments, or their dense [L, L] mask (`tree_for`). Without it each row is one
    sequence, attended causally (a model the trainer loaded, called as a plain causal LM; it applies
    no padding mask, since this attention has transformers build none)."""
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
        q = query[:, :, own]
        if seg.ancestors.numel() == 0:
            outs.append(
                F.scaled_dot_product_attention(
                    q, key[:, :, own], value[:, :, own], is_causal=True, scale=scaling
                )
            )
            continue
        a, m = seg.ancestors.numel(), seg.end - seg.start
        k = torch.cat([key.index_select(2, seg.ancestors), key[:, :, own]], dim=2)
        v = torch.cat([value.index_select(2, seg.ancestors), value[:, :, own]], dim=2)
        mask = torch.ones((m, a + m), dtype=torch.bool, device=query.device)
        mask[:, a:] = torch.ones((m, m), dtype=torch.bool, device=query.device).tril()
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling))
    out = torch.cat(outs, dim=2)
    if out.shape[2] != query.shape[2]:
        raise ValueError(f"segments cover {out.shape[2]} of the row's {query.shape[2]} positions")
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The segments are the mask: transformers builds none for this attention."""
    return None


AttentionInterface.register(TREE_ATTENTION, tree_attention)
AttentionMaskInterface.register(TREE_ATTENTION, _no_mask)
