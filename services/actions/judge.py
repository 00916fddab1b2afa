"""The model judge resource manager: `judge` actions (`{"prompt", "text"}`) scored by a model.

`score` is the mean log-probability per token of `text` given `prompt` (tokenized separately and
joined, so the boundary is exact): a likelihood, not a preference or a correctness grade. Concurrent
actions are batched into one prefill-only `/generate` call (`max_new_tokens` 0, `return_logprob`,
`logprob_start_len` at the last prompt token), on SGLang or the embedded engine. Units are
accelerator slots: at most `units` actions are in flight over all batches. An engine failure fails
its whole batch; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from swarmrl.services.actions.model import Outcome
from swarmrl.services.common.tasks import Background, wait_set
from swarmrl.services.engine.client import EngineClient, EngineError, GenerateResult, open_engine

log = logging.getLogger("swarmrl.actions.judge")

# temperature 0 (SGLang rewrites it to 1): the model's own distribution even with temperature-scaled logprobs
SCORE_PARAMS = {"max_new_tokens": 0, "temperature": 0}
MAX_BATCH = 32
"""Most actions in one engine call."""
MAX_TOKENS = 2048
"""Most prompt + text tokens of an action: at most the engine's context length."""
MAX_CHARS = 200_000
TIMEOUT_S = 120.0


@dataclass
class _Item:
    ids: list[int]
    start: int  # logprob_start_len: the last prompt token, whose logprob SGLang leaves None
    n_text: int
    future: asyncio.Future[Outcome] = field(repr=False)


class JudgeManager:
    """Scores judge actions on one engine (the embedded engine or SGLang), batching concurrent ones."""

    def __init__(
        self, engine_url: str, tokenizer_path: str | None, *, max_wait_s: float = 0.01, retries: int = 3
    ) -> None:
        """`tokenizer_path` None (or ""): the engine's own, from /get_model_info (same filesystem)."""
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s={max_wait_s} must be >= 0")
        self.engine_url = engine_url
        self.tokenizer_path = tokenizer_path or None
        self.max_wait_s = max_wait_s
        self.counts: Counter[str] = Counter()  # batches, actions, engine_errors, rejected
        self.batch_sizes: Counter[int] = Counter()  # engine calls by number of actions in them
        self.units = 0
        self._client: EngineClient | None = None
        self._client_args = {"timeout": TIMEOUT_S, "retries": retries}
        self._tokenizer: Any = None
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._in_flight = 0
        self._slots = asyncio.Condition()
        self._arrived = asyncio.Event()  # set on every put: wakes a batcher waiting for more items
        self._batcher: asyncio.Task[None] | None = None
        self._tasks = Background()  # the batcher and the engine calls in flight

    async def start(self, units: int) -> None:
        """Load the tokenizer and start batching with `units` accelerator slots."""
        self._client = await open_engine(self.engine_url, wait=False, **self._client_args)
        if self.tokenizer_path is None:
            info = await self._client.model_info()
            self.tokenizer_path = info.get("tokenizer_path") or info.get("model_path")
            if not self.tokenizer_path:
                raise ValueError(f"engine at {self.engine_url} names no tokenizer_path: {info}")
        from transformers import AutoTokenizer  # heavy: only once a judge is used

        self._tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.tokenizer_path)
        await self.resize(units)
        self._batcher = self._tasks.spawn(self._batch_loop(), name="judge-batcher")
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
        await self._tasks.close()
        while not self._queue.empty():
            _settle(self._queue.get_nowait(), Outcome(status="error", error="judge closed"))
        if self._client is not None:
            await self._client.aclose()

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
        if len(prompt) + len(text) > MAX_CHARS:
            raise ValueError(
                f"judge payload has {len(prompt) + len(text)} characters; the limit is {MAX_CHARS}"
            )
        prompt_ids = list(self._tokenizer.encode(prompt))
        text_ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        if not prompt_ids:
            raise ValueError("judge payload field 'prompt' is empty: the text's first token needs a context")
        if not text_ids:
            raise ValueError("judge payload field 'text' is empty: nothing to score")
        if len(prompt_ids) + len(text_ids) >= MAX_TOKENS:
            raise ValueError(
                f"judge payload is too long: {len(prompt_ids)} prompt + {len(text_ids)} text tokens, "
                f"the limit is {MAX_TOKENS}"
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
                    cap = min(MAX_BATCH, self.units - self._in_flight)
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
                    await wait_set(self._arrived, left)
            except asyncio.CancelledError:
                for item in batch:
                    _settle(item, Outcome(status="error", error="judge closed"))
                raise
            batch = [it for it in batch if not it.future.done()]  # callers that gave up (timeout)
            if not batch:
                continue
            self._in_flight += len(batch)
            self._tasks.spawn(self._call(batch), name=f"judge-batch-{len(batch)}")

    async def _call(self, batch: list[_Item]) -> None:
        """One engine call for `batch`; every item gets an outcome, whatever happens."""
        self.counts["batches"] += 1
        self.counts["actions"] += len(batch)
        self.batch_sizes[len(batch)] += 1
        started = time.monotonic()
        assert self._client is not None
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
            for item in batch:  # cancelled (close) or an unexpected failure: no caller is left waiting
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
