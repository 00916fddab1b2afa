"""A request inside the embedded engine (`Row`): its decoding state, when it is done, what it returns;
and a weight reload waiting its turn (`Swap`)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmrl.services.engine.outputs import GenerationOutput, Step
from swarmrl.services.engine.sampling import SamplingParams


@dataclass
class Row:
    """A request and its decoding state while it sits in the running batch."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    future: cf.Future[GenerationOutput]
    generator: torch.Generator | None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    stop_at: int | None = None  # character offset of a matched stop string in the text
    logprob_start: int = -1  # SGLang's logprob_start_len: -1 = no input logprobs
    input_logprobs: list[float | None] = field(default_factory=list)
    on_step: Callable[[Step], None] | None = None  # streamed: told of every unfinished step
    adapter: str | None = None  # the LoRA adapter it runs with (None: the base weights)
    cached: int = 0  # prompt tokens whose KV came from the prefix cache


@dataclass
class Swap:
    """A validated weight reload waiting for the batch to drain."""

    path: str
    tensors: dict[str, torch.Tensor]
    version: str | None
    done: cf.Future[str] = field(default_factory=cf.Future)
    adapter: str | None = None
    """A LoRA adapter's weights (peft key names) for this adapter name; None: the base's."""
    lora_config: Any = None


def check_finished(row: Row, eos_ids: set[int], context_length: int, tokenizer: Any) -> None:
    """Set `row.finish` if its last token ends it (SGLang's order: length, EOS, stop strings)."""
    p, n, tok = row.params, len(row.output_ids), row.output_ids[-1]
    if n >= p.max_new_tokens or len(row.prompt) + n >= context_length:
        row.finish = {"type": "length", "length": n}
    elif (not p.ignore_eos and tok in eos_ids) or tok in p.stop_token_ids:
        row.finish = {"type": "stop", "matched": tok}
    elif p.stop and tokenizer is not None:
        text = tokenizer.decode(row.output_ids, skip_special_tokens=p.skip_special_tokens)
        hits = [(text.find(s), s) for s in p.stop if s in text]
        if hits:
            row.stop_at, matched = min(hits)
            row.finish = {"type": "stop", "matched": matched}


def step(row: Row, version: str) -> Step:
    """What a streamed request is told after a step that did not finish it."""
    return Step(
        rid=row.rid,
        output_ids=list(row.output_ids),
        output_logprobs=list(row.logprobs),
        prompt_tokens=len(row.prompt),
        weight_version=version,
        input_logprobs=row.input_logprobs,
        input_logprob_ids=row.prompt[row.logprob_start :] if row.input_logprobs else [],
        cached_tokens=row.cached,
    )


def output(row: Row, version: str, tokenizer: Any) -> GenerationOutput:
    """A finished request's result; the text leaves out a matched stop token or string (SGLang's)."""
    assert row.finish is not None
    text = ""
    if tokenizer is not None:
        ids = row.output_ids
        if isinstance(row.finish.get("matched"), int) and not row.params.no_stop_trim:
            ids = ids[:-1]
        text = tokenizer.decode(ids, skip_special_tokens=row.params.skip_special_tokens)
        if row.stop_at is not None and not row.params.no_stop_trim:
            text = text[: row.stop_at]
    return GenerationOutput(**vars(step(row, version)), text=text, finish_reason=row.finish)


def settle(
    fut: cf.Future[GenerationOutput], out: GenerationOutput | None = None, exc: BaseException | None = None
) -> None:
    """Resolve a request's future unless its caller cancelled it meanwhile (from another thread)."""
    with contextlib.suppress(cf.InvalidStateError):
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(out)  # type: ignore[arg-type]  # out is given whenever exc is not


def reusable(row: Row) -> int:
    """How many of a row's prompt tokens may come from the prefix cache: all but the last (its logits
    pick the first output token), and none from `logprob_start` on (their logits are needed)."""
    n = len(row.prompt) - 1
    return n if row.logprob_start < 0 else min(n, row.logprob_start)


def tail(rows: list[Row]) -> int:
    """How many last positions' logits a prefill keeps: 1 for sampling, more for input logprobs."""
    return max([1] + [len(r.prompt) - r.logprob_start for r in rows if r.logprob_start >= 0])
