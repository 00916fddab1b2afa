"""The model judge resource manager: `judge` actions scored by a model, many actions per engine call.

Consumes: judge payloads `{"prompt": str, "text": str}` through `run()`, and the accelerator slots
the scheduler grants (`start` / `resize`). Publishes: one `Outcome` per action, with
`result = {"score", "tokens", "logprob_sum"}`; no NATS here (the service wires it).

What it computes (a likelihood judge): `score` is the mean log-probability per token of `text`
given `prompt` under the judge model, `sum_i log p(t_i | prompt, t_<i) / n` over the n tokens of
`text` (prompt and text are tokenized separately and joined, so the boundary is exact). Higher is
more likely; it is not a preference or a correctness grade.

How it maps to the engine: one SGLang `/generate` call per batch with a list of `input_ids`,
`sampling_params = {"max_new_tokens": 0, "temperature": 0}` (a prefill-only request; temperature 0
keeps temperature-scaled logprobs neutral), `return_logprob: true` and per prompt
`logprob_start_len = len(prompt_ids) - 1`. SGLang returns `meta_info.input_token_logprobs` for
`input_ids[logprob_start_len:]` with the first value always None, so the entries after it are
exactly the text's tokens. The embedded CPU engine implements the same fields (`services/engine`).

Batching: concurrent `run()` calls wait in a queue; a batcher takes up to `min(max_batch, free
slots)` of them, waiting at most `max_wait_s` for more, and sends them as one engine call. Units are
accelerator slots: at most `units` actions are in flight at once, over all batches. An engine
failure gives every action of its batch `status="error"`; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from swarmrl.services.actions.model import Outcome
from swarmrl.services.common.tasks import Background
from swarmrl.services.engine.client import EngineClient, EngineError, GenerateResult, open_engine

log = logging.getLogger("swarmrl.actions.judge")

# temperature 0: SGLang rewrites it to 1, so even a server started with SGLANG_TEMP_SCALED_LOGPROBS
# returns the model's own distribution
SCORE_PARAMS = {"max_new_tokens": 0, "temperature": 0}


@dataclass
class _Item:
    ids: list[int]
    start: int  # logprob_start_len: the last prompt token, whose logprob SGLang leaves None
    n_text: int
    future: asyncio.Future[Outcome] = field(repr=False)


class JudgeManager:
    """Scores judge actions on one engine (the embedded engine or SGLang), batching concurrent ones."""

    def __init__(
        self,
        engine_url: str,
        tokenizer_path: str | None,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.01,
        max_tokens: int = 2048,
        max_chars: int = 200_000,
        timeout_s: float = 120.0,
        retries: int = 3,
    ) -> None:
        """`tokenizer_path` None (or ""): the engine's own, from its /get_model_info (same filesystem).
        `max_tokens` bounds prompt + text tokens and must not exceed the engine's context length."""
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch={max_batch} must be >= 1 and max_wait_s={max_wait_s} >= 0")
        self.engine_url = engine_url
        self.tokenizer_path = tokenizer_path or None
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_tokens = max_tokens
        self.max_chars = max_chars
        self.counts: Counter[str] = Counter()  # batches, actions, engine_errors, rejected
        self.batch_sizes: Counter[int] = Counter()  # engine calls by number of actions in them
        self.units = 0
        self._client = EngineClient(engine_url, timeout=timeout_s, retries=retries)
        self._client_args = {"timeout": timeout_s, "retries": retries}
        self._tokenizer: Any = None
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._in_flight = 0
        self._slots = asyncio.Condition()
        self._arrived = asyncio.Event()  # set on every put: wakes a batcher waiting for more items
        self._batcher: asyncio.Task[None] | None = None
        self._calls = Background()  # engine calls in flight

    async def start(self, units: int) -> None:
        """Load the tokenizer and start batching with `units` accelerator slots."""
        await (
            self._client.aclose()
        )  # now that the engine answers, the client for its API (SGLang's or vLLM's)
        self._client = await open_engine(self.engine_url, wait=False, **self._client_args)
        if self.tokenizer_path is None:
            info = await self._client.model_info()
            self.tokenizer_path = info.get("tokenizer_path") or info.get("model_path")
            if not self.tokenizer_path:
                raise ValueError(f"engine at {self.engine_url} names no tokenizer_path: {info}")
        from transformers import AutoTokenizer  # heavy: only once a judge is used

        self._tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.tokenizer_path)
        await self.resize(units)
        self._batcher = asyncio.create_task(self._batch_loop(), name="judge-batcher")
        log.info("judge ready engine=%s tokenizer=%s units=%d", self.engine_url, self.tokenizer_path, units)

    async def resize(self, units: int) -> None:
        """Set the slots; shrinking lets running batches finish and holds back new ones."""
        if units < 0:
            raise ValueError(f"units={units} must be >= 0")
        async with self._slots:
            self.units = units
            self._slots.notify_all()

    async def run(self, payload: dict[str, Any]) -> Outcome:
        """Score one action; bad payloads are `rejected`, engine failures `error`."""
        if self._batcher is None or self._batcher.done():
            return Outcome(status="error", error="judge is not running (start() not called, or closed)")
        try:
            item = self._prepare(payload)
        except ValueError as exc:
            self.counts["rejected"] += 1
            return Outcome(status="rejected", error=str(exc))
        self._queue.put_nowait(item)
        self._arrived.set()
        return await item.future

    async def close(self) -> None:
        """Stop batching; queued and running actions end with `error`."""
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
        await self._calls.close()
        while not self._queue.empty():
            _settle(self._queue.get_nowait(), Outcome(status="error", error="judge closed"))
        await self._client.aclose()

    # -- internals ------------------------------------------------------------------------------

    def _prepare(self, payload: Any) -> _Item:
        """Validate and tokenize; ValueError names the offending field and value."""
        if not isinstance(payload, dict):
            raise ValueError(
                f"judge payload must be an object with 'prompt' and 'text', got {type(payload).__name__}"
            )
        for key in ("prompt", "text"):
            if key not in payload:
                raise ValueError(f"judge payload has no '{key}' field (fields: {sorted(payload)})")
            if not isinstance(payload[key], str):
                raise ValueError(
                    f"judge payload field '{key}' must be a string, got {type(payload[key]).__name__}"
                )
        prompt, text = payload["prompt"], payload["text"]
        if len(prompt) + len(text) > self.max_chars:
            raise ValueError(
                f"judge payload has {len(prompt) + len(text)} characters; the limit is {self.max_chars}"
            )
        prompt_ids = list(self._tokenizer.encode(prompt))
        text_ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        if not prompt_ids:
            raise ValueError("judge payload field 'prompt' is empty: the text's first token needs a context")
        if not text_ids:
            raise ValueError("judge payload field 'text' is empty: nothing to score")
        n = len(prompt_ids) + len(text_ids)
        if n >= self.max_tokens:
            raise ValueError(
                f"judge payload is too long: {len(prompt_ids)} prompt + {len(text_ids)} text tokens, "
                f"the limit is {self.max_tokens}"
            )
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        return _Item(prompt_ids + text_ids, len(prompt_ids) - 1, len(text_ids), future)

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch: list[_Item] = []
            try:
                batch.append(await self._queue.get())
                async with self._slots:
                    await self._slots.wait_for(lambda: self._in_flight < self.units)
                    cap = min(self.max_batch, self.units - self._in_flight)
                deadline = loop.time() + self.max_wait_s
                while len(batch) < cap:
                    if not self._queue.empty():
                        batch.append(self._queue.get_nowait())
                        continue
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    # wait on an event, not on queue.get(): a timed-out get can lose an item (3.11)
                    self._arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.CancelledError:
                for item in batch:
                    _settle(item, Outcome(status="error", error="judge closed"))
                raise
            batch = [it for it in batch if not it.future.done()]  # callers that gave up (timeout)
            if not batch:
                continue
            self._in_flight += len(batch)
            self._calls.spawn(self._call(batch), name=f"judge-batch-{len(batch)}")

    async def _call(self, batch: list[_Item]) -> None:
        """One engine call for `batch`; every item gets an outcome, whatever happens."""
        self.counts["batches"] += 1
        self.counts["actions"] += len(batch)
        self.batch_sizes[len(batch)] += 1
        started = time.monotonic()
        try:
            results = await self._client.generate_batch(
                [it.ids for it in batch], SCORE_PARAMS, True, [it.start for it in batch]
            )
            run_s = time.monotonic() - started
            for item, res in zip(batch, results, strict=True):
                _settle(item, _outcome(item, res, run_s))
        except (EngineError, httpx.HTTPError, ValueError) as exc:  # the engine failed the whole call
            self.counts["engine_errors"] += 1
            log.warning("judge engine call of %d actions failed: %s", len(batch), exc)
            for item in batch:
                _settle(item, Outcome(status="error", error=str(exc), run_s=time.monotonic() - started))
        finally:
            for item in batch:  # cancelled (close) or an unexpected failure: never leave a caller waiting
                _settle(item, Outcome(status="error", error="judge engine call did not complete"))
            async with self._slots:
                self._in_flight -= len(batch)
                self._slots.notify_all()


def _outcome(item: _Item, res: GenerateResult, run_s: float) -> Outcome:
    lps = res.input_logprobs[1:]  # [0] is the last prompt token: None by SGLang's convention
    if len(lps) != item.n_text or any(lp is None for lp in lps):
        return Outcome(
            status="error",
            error=f"engine returned input logprobs {res.input_logprobs[:8]}... ({len(res.input_logprobs)}) "
            f"for {item.n_text} text tokens",
            run_s=run_s,
        )
    total = sum(lp for lp in lps if lp is not None)
    return Outcome(
        status="ok",
        result={"score": total / item.n_text, "tokens": item.n_text, "logprob_sum": total},
        run_s=run_s,
    )


def _settle(item: _Item, outcome: Outcome) -> None:
    if not item.future.done():
        item.future.set_result(outcome)
