"""GRPO core (pure logic and torch): sample checks, staleness, advantages, PPO-clip token loss.

Advantages: the unit of reward is one agent in one episode; A = (r - mean) / (std + eps), population
std, over samples (or over units with `per_episode_norm`). A group of equal rewards is skipped.

Loss per generated token with advantage A (`token_loss`), averaged over all tokens of an update:
- on-policy (current version, or behaviour logprob unknown = NaN, then taken as the current one):
  r = exp(logp - logp_behaviour), loss = -min(r A, clip(r, 1-eps_low, 1+eps_high) A);
- off-policy (older version): decoupled PPO (Hilton et al. 2021), the trust region around the
  proximal policy (the step's starting weights), times the truncated importance weight
  w = min(exp(logp_prox - logp_behaviour), is_cap): loss = -w min(r A, clip(r) A), r = exp(logp - logp_prox);
- optional KL to the reference model, k3 estimator: exp(ref - logp) - (ref - logp) - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swarmrl.schemas import Sample

ADV_EPS = 1e-6
LOG_RATIO_MAX = 20.0  # exp() of a larger log-ratio overflows float32; the clip makes it moot anyway


def check_sample(sample: Sample, model: str, vocab_size: int) -> str | None:
    """A dead-letter reason (`<code>: <detail>`) if the trainer cannot learn from `sample`, else None."""
    if sample.model != model:
        return (
            f"subject: sample {sample.sample_id} is for model {sample.model!r}, this trainer trains {model!r}"
        )
    if any(m not in (0, 1) for m in sample.loss_mask):
        return f"schema: loss_mask of {sample.sample_id} holds values other than 0/1"
    if not any(sample.loss_mask[1:]):  # token 0 has no context, it can never be trained
        return f"empty: sample {sample.sample_id} has no trainable generated token"
    bad = [t for t in sample.token_ids if not 0 <= t < vocab_size]
    if bad:
        return f"schema: token ids {bad[:5]} of {sample.sample_id} outside the vocabulary [0, {vocab_size})"
    if not 0 <= sample.index < sample.n_samples:
        return f"schema: index {sample.index} not in [0, n_samples={sample.n_samples}) for {sample.sample_id}"
    return None


def generated_versions(sample: Sample) -> list[int]:
    """The policy version of every trained token of `sample` whose version is known."""
    return [v for v, m in zip(sample.policy_versions, sample.loss_mask, strict=True) if m and v >= 0]


def staleness(sample: Sample, version: int) -> int:
    """How many versions the oldest generated token of `sample` is behind `version` (>= 0)."""
    versions = generated_versions(sample)
    return max(0, version - min(versions)) if versions else 0


@dataclass
class GroupScore:
    status: str
    """`ok`, `zero_adv` (all rewards equal), `too_small` (fewer than min_group_size fresh episodes) or
    `nonfinite` (a NaN or infinite reward)."""
    advantages: list[float]  # per sample, in input order; 0.0 for stale samples
    stale: list[bool]
    reward_mean: float = 0.0
    reward_std: float = 0.0


def score_group(
    samples: list[Sample],
    version: int,
    *,
    max_staleness: int,
    min_group_size: int,
    per_episode_norm: bool = False,
    skip_zero_adv: bool = True,
) -> GroupScore:
    """Drop stale samples, then compute GRPO advantages over the rest of the group."""
    stale = [staleness(s, version) > max_staleness for s in samples]
    fresh = [s for s, st in zip(samples, stale, strict=True) if not st]
    zeros = [0.0] * len(samples)
    if len({s.episode_id for s in fresh}) < min_group_size:
        return GroupScore("too_small", zeros, stale)
    units: dict[tuple[str, str], list[float]] = {}
    for s in fresh:
        units.setdefault((s.episode_id, s.agent), []).append(s.reward)
    unit_reward = {k: sum(v) / len(v) for k, v in units.items()}
    if not all(math.isfinite(r) for r in unit_reward.values()):  # the schema refuses them too
        return GroupScore("nonfinite", zeros, stale)
    if per_episode_norm:
        pool = list(unit_reward.values())
    else:
        pool = [unit_reward[(s.episode_id, s.agent)] for s in fresh]
    mean = sum(pool) / len(pool)
    std = math.sqrt(sum((r - mean) ** 2 for r in pool) / len(pool))
    if max(pool) - min(pool) <= 1e-12 and skip_zero_adv:
        return GroupScore("zero_adv", zeros, stale, mean, std)
    adv = [
        0.0 if st else (unit_reward[(s.episode_id, s.agent)] - mean) / (std + ADV_EPS)
        for s, st in zip(samples, stale, strict=True)
    ]
    return GroupScore("ok", adv, stale, mean, std)


@dataclass
class TokenLoss:
    loss: torch.Tensor  # per-token loss [T] (sum it and divide by the update's token count)
    clipped: torch.Tensor  # per-token bool: the clip is active (no gradient from this token)
    is_weight: torch.Tensor  # per-token importance weight (1 on on-policy tokens)
    kl: torch.Tensor  # per-token k3 KL estimate (zeros without a reference model)


def token_loss(
    logp: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    off_policy: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    is_cap: float,
    prox: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> TokenLoss:
    """PPO-clip loss of generated tokens, every argument a 1-D tensor over them. `logp` carries the
    gradient; `behaviour` may hold NaN; `prox` defaults to the detached `logp`."""
    prox = logp.detach() if prox is None else prox
    known = ~torch.isnan(behaviour)
    behaviour = torch.where(known, behaviour, prox)
    off = off_policy & known
    anchor = torch.where(off, prox, behaviour)
    ratio = torch.exp((logp - anchor).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX))
    surr = ratio * advantages
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    is_weight = torch.where(off, torch.exp((prox - behaviour).clamp(max=math.log(is_cap))), 1.0)
    loss = -is_weight * torch.minimum(surr, surr_clipped)
    kl = torch.zeros_like(loss)
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        loss = loss + kl_coef * kl
    return TokenLoss(loss=loss, clipped=surr_clipped < surr, is_weight=is_weight, kl=kl.detach())
