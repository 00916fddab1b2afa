"""Timelines of one episode and how they merge (pure logic, no NATS).

Consumes the `LlmEvent`s of one episode; produces the timelines that survive merging, which the
assembler turns into `Sample`s.

Every LLM call starts as its own timeline: tokens = prompt_ids + output_ids, trainable (loss mask 1)
exactly on the output. The gateway builds a later prompt from the exact token ids of the episode's
earlier calls, so in a multi-turn conversation call k+1 starts with call k's prompt + output. Such a
timeline A is *absorbed* into the longer timeline B that extends it: B's copy of A's generated tokens
becomes trainable with A's original logprobs and policy version, and A is no longer a sample of its
own. Shortest timelines are absorbed first, so absorption is transitive (a 6-turn game becomes one
sample with all six outputs trainable).

Rules, and why:
- Only timelines of the same (agent, model) merge: one agent's context is not another's.
- A is absorbed into the *shortest* longer timeline that extends it (ties: earliest call). When
  several branches extend A (a retried turn), A's output is trained once, in one branch.
- Absorption never overwrites a trainable token: if A's trainable positions are already trainable in
  B (B generated them itself, or absorbed another call there), the next candidate is tried, else A
  survives on its own. So every generated token is trained exactly once, with the logprob and policy
  version of the call that generated it (trained tokens before == after).
- `token` mode (default): B extends A iff B.tokens[:len(A.tokens)] == A.tokens.
- `text` mode: additionally B's request must repeat A's request and A's reply (role, content, tool
  calls after normalisation; see `messages.py`) and use the same tools unless `ignore_tools`.
  When the text says "prefix" but the tokens drift (the client edited the history, or a gateway
  without this episode's cache re-tokenised it), A is kept as its own sample. B's re-tokenised copy of
  A's reply is not what the model generated, so marking it trainable would break "loss mask 1
  exactly on model-generated tokens", and placing it needs the tokenizer (the gateway owns it).
- Divergent histories (a retry that edited earlier context, per-agent private context) are not
  prefixes of each other, so all of them survive.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from swarmrl.schemas import LlmEvent
from swarmrl.services.merger.messages import is_text_prefix

MergeMode = Literal["token", "text"]


@dataclass(frozen=True)
class MergeOptions:
    merge: bool = True
    """False keeps every call as its own sample (the benchmark's baseline)."""
    mode: MergeMode = "token"
    """`token`: exact token-id prefix; `text`: message-level prefix and exact tokens."""
    ignore_tools: bool = False
    """Text mode: a different `tools` list does not block absorption."""


@dataclass
class Timeline:
    """One call's token sequence, possibly with earlier calls of the same context absorbed into it."""

    agent: str
    model: str
    order: int
    """Position of the call among the episode's calls; orders samples deterministically."""
    prompt_len: int
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    request: list[dict[str, Any]] = field(default_factory=list)
    """The OpenAI request messages of the call."""
    output_text: str = ""
    """The reply as generated (raw text); with `request` it is the timeline's text."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Trainable [start, end) ranges: the call's own output plus those of absorbed calls."""
    n_calls: int = 1

    @classmethod
    def from_call(cls, ev: LlmEvent, order: int) -> Timeline:
        p, n = len(ev.prompt_ids), len(ev.output_ids)
        return cls(
            agent=ev.agent,
            model=ev.model,
            order=order,
            prompt_len=p,
            tokens=[*ev.prompt_ids, *ev.output_ids],
            loss_mask=[0] * p + [1] * n,
            logprobs=[0.0] * p + list(ev.output_logprobs),
            policy_versions=[-1] * p + [ev.policy_version] * n,
            request=list(ev.messages),
            output_text=ev.output_text,
            tools=list(ev.tools),
            spans=[(p, p + n)] if n else [],
        )

    @property
    def trained_tokens(self) -> int:
        return sum(e - s for s, e in self.spans)

    def copy(self) -> Timeline:
        return dataclasses.replace(
            self,
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            policy_versions=list(self.policy_versions),
            spans=list(self.spans),
        )


def token_prefix(a: Timeline, b: Timeline) -> bool:
    """Is A's token sequence a strict prefix of B's?"""
    n = len(a.tokens)
    if n >= len(b.tokens):
        return False
    # cheap rejections before the full comparison (C-speed, but it copies n ids)
    if n and (b.tokens[n - 1] != a.tokens[n - 1] or b.tokens[0] != a.tokens[0]):
        return False
    return b.tokens[:n] == a.tokens


def extends(a: Timeline, b: Timeline, opts: MergeOptions) -> bool:
    """May B absorb A? (same agent and model, and a prefix in the configured mode)"""
    if (a.agent, a.model) != (b.agent, b.model) or not token_prefix(a, b):
        return False
    if opts.mode == "text":
        return is_text_prefix(a.request, a.output_text, a.tools, b.request, b.tools, opts.ignore_tools)
    return True


def absorb(a: Timeline, b: Timeline) -> bool:
    """Make B's copy of A's trainable tokens trainable with A's values; False if any already is."""
    if any(any(b.loss_mask[s:e]) for s, e in a.spans):
        return False
    for s, e in a.spans:
        b.loss_mask[s:e] = a.loss_mask[s:e]
        b.logprobs[s:e] = a.logprobs[s:e]
        b.policy_versions[s:e] = a.policy_versions[s:e]
    b.spans = sorted(b.spans + a.spans)
    b.n_calls += a.n_calls
    return True


def merge_timelines(timelines: list[Timeline], opts: MergeOptions = MergeOptions()) -> list[Timeline]:
    """The timelines that survive merging, ordered by call order. The inputs are not modified."""
    work = [t.copy() for t in timelines]
    if not opts.merge:
        return sorted(work, key=lambda t: t.order)
    # Shortest first: when A is absorbed, everything shorter that A could absorb already has been.
    by_length = sorted(work, key=lambda t: (len(t.tokens), t.order))
    survivors: list[Timeline] = []
    for pos, a in enumerate(by_length):
        for b in by_length[pos + 1 :]:
            if extends(a, b, opts) and absorb(a, b):
                break
        else:
            survivors.append(a)
    return sorted(survivors, key=lambda t: t.order)
