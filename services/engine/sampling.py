"""Sampling parameters (SGLang's names and defaults) and the batched sampler of the embedded engine.

The logprob is SGLang 0.5's: `log_softmax(logits / temperature)` at the token (temperature 1 when
greedy, below 1e-6), before top-k / top-p / min-p, so NOT renormalised over the kept tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

SAMPLING_EPS = 1e-6
"""Below this temperature sampling is greedy (SGLang's `_SAMPLING_EPS`)."""

# SGLang sampling params accepted only at their neutral value: a request relying on one fails (400)
_NEUTRAL = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1,
    "spaces_between_special_tokens": True, "stream_interval": None,
    **dict.fromkeys(["json_schema", "regex", "ebnf", "structural_tag", "logit_bias", "custom_params"]),
}  # fmt: skip


@dataclass
class SamplingParams:
    """Per-request sampling parameters; field names and defaults follow SGLang's `SamplingParams`."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None  # SGLang spells it `sampling_seed`; both are accepted

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None, vocab_size: int) -> SamplingParams:
        """Validate an SGLang `sampling_params` dict; ValueError names the offending key and value."""
        raw = dict(raw or {})
        if "sampling_seed" in raw:
            raw.setdefault("seed", raw.pop("sampling_seed"))
        for key, neutral in _NEUTRAL.items():
            if key in raw:
                value = raw.pop(key)
                if value != neutral and value is not None:
                    raise ValueError(
                        f"sampling param {key}={value!r} is not supported by the embedded engine"
                    )
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown sampling params {unknown}")
        stop = raw.pop("stop", None)
        params = cls(**raw, stop=[stop] if isinstance(stop, str) else list(stop or []))
        params._check(vocab_size)
        return params

    def _check(self, vocab_size: int) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {self.max_new_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (self.top_k == -1 or (isinstance(self.top_k, int) and self.top_k >= 1)):
            raise ValueError(f"top_k must be -1 (whole vocabulary) or >= 1, got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        bad = [t for t in self.stop_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad} outside the vocabulary [0, {vocab_size})")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


CHUNK = 4096
"""Vocabulary slice `draw` sums and searches at a time: its scratch is [rows, CHUNK], not [rows, V]."""


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    shared: torch.Generator | None = None,
    *,
    scratch: bool = False,
) -> tuple[list[int], list[float]]:
    """Pick one token per row of `logits` [B, V]; return the tokens and their logprobs. A row with its
    own generator (a seeded request) draws from it alone, the others together from `shared`;
    `scratch` lets a float32 `logits` be overwritten."""
    x = logits if scratch and logits.dtype == torch.float32 else logits.to(torch.float32, copy=True)
    dev = x.device
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], dtype=x.dtype, device=dev)
    x.div_(temps[:, None])
    tokens = x.argmax(dim=-1)  # the greedy picks; the others are drawn below
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()  # p * Z per row, the largest entry 1
    log_z = x.sum(dim=-1, dtype=torch.float64).log()
    rows = [i for i, p in enumerate(params) if not p.greedy]
    for i in rows:
        if params[i].top_k != -1 or params[i].top_p < 1.0 or params[i].min_p > 0.0:
            x[i] = _filtered_probs(x[i], params[i])
    together = [i for i in rows if generators[i] is None]
    if together:
        tokens[together] = draw(x, shared, together)
    for i in rows:
        if generators[i] is not None:
            tokens[i] = draw(x, generators[i], [i])[0]
    chosen = x.gather(1, tokens[:, None])[:, 0].double().log() - log_z
    return tokens.tolist(), chosen.tolist()


def draw(
    probs: torch.Tensor, generator: torch.Generator | None, rows: list[int] | None = None
) -> torch.Tensor:
    """One index per row of `probs` [B, V] (unnormalised, >= 0; of `rows` only, if given), drawn in
    proportion to it: the inverse CDF at one uniform number per row, found first among slices of
    `CHUNK` entries, then inside the chosen one (`torch.multinomial` draws V numbers per row on the
    CPU). Sums are float64, so a token of probability 0 is never picked."""
    vocab, dev = probs.shape[-1], probs.device
    picked = probs if rows is None or len(rows) == len(probs) else probs[rows]
    n_rows, starts = len(picked), range(0, vocab, CHUNK)
    sums = torch.stack([picked[:, s : s + CHUNK].sum(-1, dtype=torch.float64) for s in starts], dim=1)
    cum = sums.cumsum(-1)
    u = torch.rand(n_rows, 1, generator=generator, dtype=torch.float64, device=dev) * cum[:, -1:]
    chunk = _pick(cum, sums, u[:, 0])
    before = (cum - sums).gather(1, chunk[:, None])  # mass of the slices before the chosen one
    columns = chunk[:, None] * CHUNK + torch.arange(CHUNK, device=dev)
    values = picked.gather(1, columns.clamp(max=vocab - 1)).double()
    values[columns >= vocab] = 0.0
    return chunk * CHUNK + _pick(values.cumsum(-1), values, (u - before)[:, 0])


def _pick(cum: torch.Tensor, mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first entry whose cumulative mass exceeds u, never an entry of mass 0 (rounding
    can leave u at or past the row's total: then the last entry with mass)."""
    pos = torch.searchsorted(cum, u[:, None], right=True)[:, 0]
    last = mass.shape[-1] - 1 - (mass > 0).flip(-1).to(torch.int8).argmax(-1)
    return torch.minimum(pos, last)


def _filtered_probs(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Zero the tokens top-k, top-p and min-p exclude (in SGLang's order) from a row of probabilities
    (unnormalised: top-p measures against the row's total); `draw` renormalises."""
    total = float(probs.sum(dtype=torch.float64))
    sorted_probs, order = probs.sort(descending=True)
    if p.top_k != -1:
        sorted_probs[p.top_k :] = 0.0
    if p.top_p < 1.0:  # the smallest prefix whose mass reaches top_p (the first token always)
        before = sorted_probs.cumsum(0) - sorted_probs
        sorted_probs[before > p.top_p * total] = 0.0
    if p.min_p > 0.0:
        sorted_probs[sorted_probs < p.min_p * sorted_probs[0]] = 0.0
    return torch.zeros_like(probs).scatter_(0, order, sorted_probs)
