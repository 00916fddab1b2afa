"""Timelines of one episode and how they merge (pure logic).

Every LLM call starts as its own timeline: prompt_ids + output_ids, trainable (loss mask 1) exactly
on the output. The gateway builds a later prompt from the exact token ids of earlier calls, so a
timeline A is often a prefix of a longer one B: A is then *absorbed* into B (B's copy of A's output
becomes trainable with A's logprobs and policy version). Shortest first, so absorption is transitive.

- Only timelines of the same (agent, model) merge.
- A goes into the shortest longer timeline that extends it (ties: earliest call), so a retried turn
  is trained once.
- Absorption never overwrites a trainable token (the next candidate is tried, else A survives), so
  every generated token is trained exactly once (trained tokens before == after).
- `token` mode: B extends A iff B.tokens[:len(A.tokens)] == A.tokens. `text` mode: B's request must
  also repeat A's request and reply (`messages.py`) with the same tools unless `ignore_tools`; when
  the text matches but the tokens drift, A is kept on its own (B's re-tokenised copy of A's reply
  is not what the model generated).
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

    def copy(self) -> Timeline:
        return dataclasses.replace(
            self, loss_mask=list(self.loss_mask), logprobs=list(self.logprobs),
            policy_versions=list(self.policy_versions), spans=list(self.spans),
        )  # fmt: skip


def extends(a: Timeline, b: Timeline, opts: MergeOptions) -> bool:
    """May B absorb A? Same agent and model, A's tokens a strict prefix of B's, and in `text` mode
    B's request repeating A's."""
    n = len(a.tokens)
    if (a.agent, a.model) != (b.agent, b.model) or n >= len(b.tokens):
        return False
    # cheap rejections before the full comparison (C-speed, but it copies n ids)
    if n and (b.tokens[n - 1] != a.tokens[n - 1] or b.tokens[0] != a.tokens[0]) or b.tokens[:n] != a.tokens:
        return False
    return opts.mode != "text" or is_text_prefix(
        a.request, a.output_text, a.tools, b.request, b.tools, opts.ignore_tools
    )


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
