"""The embedded engine's CPU attention: each KV head's group of query heads as one matrix, two batched
matmuls, no KV repeat (SDPA costs far more than its arithmetic at decode shapes on the CPU,
`bench/results/real-model.md`). Registered with transformers under `ENGINE_ATTENTION`, with its SDPA mask.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ENGINE_ATTENTION = "swarmrl_engine"

LONG = 1 << 22
"""Above this many scores per row and KV head (`groups * q * L`), prefill goes to SDPA instead: its
tiled kernel keeps memory flat where a full score matrix would not."""


def engine_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, Hq, q, D], key/value [B, Hkv, L, D], mask
    [B, 1, q, L] (True = attend) or None (causal) -> [B, q, Hq, D]."""
    if dropout:
        raise ValueError(f"{ENGINE_ATTENTION} attention serves models in eval mode (no dropout)")
    q, d, length = query.shape[2], query.shape[3], key.shape[2]
    groups = query.shape[1] // key.shape[1]
    scale = d**-0.5 if scaling is None else scaling
    if attention_mask is None and q > 1:  # transformers skipped the mask: plain causal, no padding
        attention_mask = torch.ones(q, length, dtype=torch.bool, device=query.device).tril(length - q)
    if groups * q * length > LONG and softcap is None:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scale, enable_gqa=groups > 1
        )
        return out.transpose(1, 2).contiguous(), None
    return grouped_attention(query, key, value, attention_mask, scale, softcap), None


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention with a boolean mask broadcasting to [B, 1, q, L] (True = attend); -> [B, q, Hq, D].
    Differentiable (the trainer's short rows run through it too)."""
    b, hq, q, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    groups = hq // hkv
    # query heads h = kv * groups + j share KV head kv (transformers' repeat_kv order)
    grouped = query.reshape(b, hkv, groups * q, d)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    if mask is not None:  # a finite floor: a fully masked (padding) row stays finite
        allowed = mask.reshape(-1, 1, 1, q, length)
        scores = scores.view(b, hkv, groups, q, length).masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.view(b, hkv, groups * q, length), dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).view(b, hq, q, d)
    return out.transpose(1, 2).contiguous()


AttentionInterface.register(ENGINE_ATTENTION, engine_attention)
AttentionMaskInterface.register(ENGINE_ATTENTION, sdpa_mask)
