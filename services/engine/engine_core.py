"""The embedded engine: any HF full-attention causal LM on the CPU or one CUDA device, continuous
batching over a KV cache, outputs shaped after SGLang's `/generate` (`server.py`).

One scheduler thread owns the model: between decode steps it admits pending requests, prefills them
(`prefill_plan.py`) from the prefix cache (`prefix_cache.py`) and joins them to the running batch
(`kv_batch.py`). Weights change only when no request runs, so every output comes from one version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import queue
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM
from transformers.cache_utils import Cache

from swarmrl.core.precision import resolve_dtype
from swarmrl.services.engine import model_dir
from swarmrl.services.engine.attention import ENGINE_ATTENTION
from swarmrl.services.engine.kv_batch import KVBatch, cache_argument, left_padded, past_cache, row_kv
from swarmrl.services.engine.lora import Merged
from swarmrl.services.engine.outputs import GenerationOutput, RequestStream, Step
from swarmrl.services.engine.prefill_plan import buckets, waves
from swarmrl.services.engine.prefix_cache import PrefixCache
from swarmrl.services.engine.reloads import FLUSH, Reloads
from swarmrl.services.engine.rows import Row, Swap, check_finished, output, reusable, settle, step, tail
from swarmrl.services.engine.sampling import SamplingParams, sample

log = logging.getLogger("swarmrl.engine.core")

_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""The attention kernels a CUDA engine's forwards may use: all of torch's but cuDNN's (see `_loop`)."""

_STOP = object()


class EngineCore(Reloads):
    """Loads `model_path` and serves generation from a scheduler thread; thread-safe entry points."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_batch: int = 16,
        device: str = "cpu",
        dtype: str = "auto",
        weight_version: str = "0",
        seed: int = 0,
        context_length: int | None = None,
        adapters: Sequence[str] = (),
        prefix_cache_mib: int = 256,
        merge_lora: bool = True,
    ) -> None:
        self.model_path = str(model_path)
        self.max_batch = max_batch
        self.device = torch.device(device)
        # on the CPU `attention.py`, which beats SDPA at decode shapes; on CUDA torch's fused kernels
        attn = {"attn_implementation": ENGINE_ATTENTION} if self.device.type == "cpu" else {}
        self.dtype = resolve_dtype(dtype, self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=getattr(torch, self.dtype), **attn
        )
        self.model.to(self.device).eval()  # type: ignore[arg-type]  # transformers types .to() oddly
        self.tokenizer = model_dir.load_tokenizer(self.model_path)
        self.tokenizer_path = self.model_path if self.tokenizer is not None else None
        cfg = self.model.config.get_text_config()
        embeddings = self.model.get_input_embeddings()
        assert isinstance(embeddings, torch.nn.Embedding), type(embeddings)
        self.vocab_size = embeddings.num_embeddings  # ids past the tokenizer's but inside this are valid
        # like SGLang's --context-length: may shorten the model's window, never extend it
        model_ctx = int(getattr(cfg, "max_position_embeddings", None) or 2048)
        self.context_length: int = min(context_length or model_ctx, model_ctx)
        self.eos_ids = model_dir.eos_ids(self.model_path, cfg)
        self.weight_version = str(weight_version)
        self.base = self.model
        """The HF model; `model` becomes peft's wrapper of it once a LoRA adapter is loaded."""
        self._cache_arg = cache_argument(self.base)
        self.adapter_versions: dict[str, str] = dict.fromkeys(adapters, self.weight_version)
        """Adapter name -> its weights' version; one not loaded yet runs as the base (a fresh
        adapter's B is 0: the same outputs)."""
        self._merged = Merged(self.base) if merge_lora and len(adapters) == 1 else None
        """With one adapter and `merge_lora`: merged into the weights; every request must name it."""
        self._generator = torch.Generator(self.device).manual_seed(seed)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._batch: KVBatch[Row] = KVBatch(self.device)
        self._swap: Swap | None = None
        self._prefix = PrefixCache(prefix_cache_mib << 20)  # the scheduler thread's
        self._closed = False
        # `stats()`' counters, written by the scheduler thread only
        self.batch_sizes: Counter[int] = Counter()  # decode steps by batch size
        self.score_batch_sizes: Counter[int] = Counter()  # score-only forwards (max_new_tokens=0) by size
        self._stats_lock = threading.Lock()  # stats() copies batch_sizes while the scheduler adds keys
        self.tokens_generated = self.requests_finished = self.requests_aborted = 0
        self.prefill_forwards = 0
        self.prefill_tokens = 0  # those not served by the prefix cache
        self.prefill_padded_tokens = 0  # positions the prefill forwards computed, pads included
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()
        log.info(
            "engine ready model=%s vocab=%d context=%d", self.model_path, self.vocab_size, self.context_length
        )

    # -- entry points (any thread) --------------------------------------------------------------

    def submit(
        self,
        input_ids: list[int],
        params: SamplingParams,
        rid: str | None = None,
        logprob_start_len: int = -1,
        *,
        on_step: Callable[[Step], None] | None = None,
        future: cf.Future[GenerationOutput] | None = None,
        adapter: str | None = None,
    ) -> cf.Future[GenerationOutput]:
        """Queue one request (ValueError at once if unusable); cancelling the future aborts it.
        `logprob_start_len` >= 0 also asks for input logprobs from there; `on_step` is called from the
        scheduler thread after every step that leaves the request running (quick, never raising)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        self.check_adapter(adapter)
        self.check_prompt(input_ids)
        self.check_logprob_start(logprob_start_len, len(input_ids))
        fut: cf.Future[GenerationOutput] = future or cf.Future()
        gen = torch.Generator(self.device).manual_seed(params.seed) if params.seed is not None else None
        row = Row(
            rid or uuid.uuid4().hex, list(input_ids), params, fut, gen,
            logprob_start=logprob_start_len, on_step=on_step, adapter=adapter,
        )  # fmt: skip
        if params.max_new_tokens == 0 and logprob_start_len < 0:  # SGLang allows it: nothing to generate
            row.finish = {"type": "length", "length": 0}
            fut.set_result(self._output(row))
        else:
            self._queue.put(row)
        return fut

    async def generate(self, input_ids: list[int], params: SamplingParams, **kw: Any) -> GenerationOutput:
        """`submit`, awaited."""
        return await asyncio.wrap_future(self.submit(input_ids, params, **kw))

    def stream(self, input_ids: list[int], params: SamplingParams, **kw: Any) -> RequestStream:
        """`submit` now (errors at once), followed step by step from the running event loop."""
        stream = RequestStream(asyncio.get_running_loop())
        self.submit(input_ids, params, on_step=stream.on_step, future=stream.future, **kw)
        return stream

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(
                f"`text` input needs a tokenizer, and {self.model_path} has none: send input_ids"
            )
        return list(self.tokenizer.encode(text))

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            sizes, score_sizes = dict(self.batch_sizes), dict(self.score_batch_sizes)
        return {
            "max_batch_seen": max(sizes, default=0),
            "decode_steps": sum(sizes.values()),
            "batch_sizes": sizes,
            "score_batch_sizes": score_sizes,
            "tokens_generated": self.tokens_generated,
            "requests_finished": self.requests_finished,
            "requests_aborted": self.requests_aborted,
            "running": len(self._batch),
            "queued": self._queue.qsize(),
            "reload_pending": self._swap is not None,
            "weight_version": self.weight_version,
            "adapters": dict(self.adapter_versions),
            "prefix_cache": self._prefix.stats(),
            "prefill": {
                "forwards": self.prefill_forwards,
                "tokens": self.prefill_tokens,
                "padded_tokens": self.prefill_padded_tokens,
            },
        }

    def close(self, timeout: float = 10.0) -> None:
        """Stop the scheduler; requests still queued or running finish with `abort`."""
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def check_prompt(self, ids: list[int]) -> None:
        """ValueError unless `ids` is non-empty, in the vocabulary and shorter than the context."""
        if not ids:
            raise ValueError("input_ids is empty")
        bad = [t for t in ids if type(t) is not int or not 0 <= t < self.vocab_size]  # bool is no id
        if bad:
            raise ValueError(f"input_ids contain {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.context_length:
            raise ValueError(
                f"input has {len(ids)} tokens; the context length is {self.context_length}, "
                "leaving no room to generate"
            )

    @staticmethod
    def check_logprob_start(start: int, n_prompt: int) -> None:
        """ValueError unless `start` is -1 (no input logprobs) or a position in the prompt (SGLang's rule)."""
        if isinstance(start, bool) or not isinstance(start, int) or not -1 <= start < n_prompt:
            raise ValueError(
                f"logprob_start_len={start!r} must be -1 or in [0, {n_prompt}): "
                f"the prompt has {n_prompt} tokens"
            )

    # -- scheduler thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        # cuDNN's attention plans every new shape, and a decode step meets a new KV length each time:
        # left out (`bench/gpu_attention.py`)
        with sdpa_kernel(_SDPA_BACKENDS) if self.device.type == "cuda" else contextlib.nullcontext():
            while True:
                new: list[Row] = []
                if not self._batch and self._swap is None:
                    if not self._take(self._queue.get(), new):
                        return
                # admit whatever else is pending; a queued reload closes the door behind it
                while self._swap is None and len(self._batch) + len(new) < self.max_batch:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if not self._take(item, new):
                        return
                new = self._drop_aborted(new)
                try:
                    if new:
                        self._prefill(new)
                    if self._batch:
                        self._decode()
                except Exception as exc:  # a failed forward fails its requests, never the engine
                    log.exception("forward failed; failing %d requests", len(self._batch) + len(new))
                    for row in self._batch.rows + new:
                        settle(row.future, exc=RuntimeError(f"engine forward failed: {exc}"))
                    self._batch.clear()
                if not self._batch and self._swap is not None:
                    self._apply_swap(self._swap)
                    self._swap = None

    def _drop_aborted(self, new: list[Row]) -> list[Row]:
        """Retire running rows whose caller cancelled them; return the new rows that were not."""
        rows = self._batch.rows
        keep = [i for i, r in enumerate(rows) if not r.future.cancelled()]
        fresh = [r for r in new if not r.future.cancelled()]
        dropped = len(rows) - len(keep) + len(new) - len(fresh)
        if dropped:
            self.requests_aborted += dropped
            log.info("dropped %d aborted requests", dropped)
            self._batch.retain(keep)
        return fresh

    def _take(self, item: Any, new: list[Row]) -> bool:
        """Route one queue item; False means stop the loop."""
        if item is _STOP:
            self._abort_all(new)
            return False
        if isinstance(item, Swap):
            self._swap = item
        elif item is FLUSH:
            self._prefix.clear()
        else:
            new.append(item)
        return True

    @torch.inference_mode()
    def _prefill(self, new: list[Row]) -> None:
        """Prefill the new rows, in the forwards `prefill_plan.py` plans, and join them to the batch."""
        scored = [r for r in new if r.params.max_new_tokens == 0]  # score-only: one forward, no cache
        if scored:
            self._score(scored)
            new = [r for r in new if r.params.max_new_tokens > 0]
            if not new:
                return
        pieces: list[tuple[list[Row], Cache, torch.Tensor]] = []
        logits: list[torch.Tensor] = []
        wave = new
        while wave:
            hits = [self._prefix.lookup(r.prompt, r.adapter, reusable(r), count=False) for r in wave]
            for row, (n, _) in zip(wave, hits, strict=True):
                row.cached = n
            now, later = list(range(len(wave))), []
            if self._prefix.capacity_bytes > 0:
                now, later = waves(
                    [r.prompt for r in wave], [r.cached for r in wave], [r.adapter for r in wave]
                )
            for i in now:
                self._prefix.record(len(wave[i].prompt), wave[i].cached)
            for bucket in buckets([len(wave[i].prompt) - wave[i].cached for i in now]):
                rows = [wave[now[b]] for b in bucket]
                cache, mask, last = self._forward(rows, [hits[now[b]] for b in bucket])
                pieces.append((rows, cache, mask))
                logits.append(last)
            wave = [wave[i] for i in later]
        self._batch.join(pieces)
        self._advance([r for rows, _, _ in pieces for r in rows], torch.cat(logits))

    def _forward(
        self, rows: list[Row], hits: list[tuple[int, Any]]
    ) -> tuple[Cache, torch.Tensor, torch.Tensor]:
        """One prefill forward of `rows`, each from its prefix-cache hit, their prompts' KV then cached.
        Returns the rows' cache and mask and their last position's logits."""
        cache, past_mask = past_cache(hits, self.device)
        ids, mask, positions = left_padded([r.prompt[r.cached :] for r in rows], self.device)
        positions += torch.tensor([[r.cached] for r in rows], device=self.device)
        mask = torch.cat([past_mask, mask], dim=1)
        logits = self._prompt_forward(rows, ids, mask, positions, use_cache=True, **{self._cache_arg: cache})
        self.prefill_forwards += 1
        self.prefill_tokens += sum(len(r.prompt) - r.cached for r in rows)
        self.prefill_padded_tokens += ids.numel()
        for i, row in enumerate(rows):
            self._prefix.insert(row.prompt, partial(row_kv, cache, mask, i), row.adapter)
        return cache, mask, logits[:, -1, :]

    def _score(self, rows: list[Row]) -> None:
        """Input logprobs for `max_new_tokens=0` rows, batched in one forward; they finish at once."""
        with self._stats_lock:
            self.score_batch_sizes[len(rows)] += 1
        ids, mask, positions = left_padded([r.prompt for r in rows], self.device)
        self._prompt_forward(rows, ids, mask, positions, use_cache=False)
        for row in rows:
            row.finish = {"type": "length", "length": 0}
            self.requests_finished += 1
            settle(row.future, self._output(row))

    def _prompt_forward(
        self, rows: list[Row], ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, **kw: Any
    ) -> torch.Tensor:
        """A forward of left-padded prompts that fills the rows' input logprobs; returns the logits kept."""
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=tail(rows),
            **kw, **self._lora(rows),
        ).logits  # fmt: skip
        self._input_logprobs(rows, logits)
        return logits

    def _input_logprobs(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Fill `input_logprobs` of rows that asked; `logits` holds each row's last k positions."""
        k = logits.shape[1]
        for i, row in enumerate(rows):
            if row.logprob_start < 0:
                continue
            n = len(row.prompt) - row.logprob_start
            # position j predicts token j + 1: the first token of the range has no position in it
            steps = logits[i, k - n : k - 1].float()
            targets = torch.tensor(row.prompt[row.logprob_start + 1 :], device=steps.device)
            lp = torch.log_softmax(steps, dim=-1).gather(-1, targets[:, None])[:, 0]
            row.input_logprobs = [None, *lp.tolist()]

    @torch.inference_mode()
    def _decode(self) -> None:
        rows = self._batch.rows
        with self._stats_lock:
            self.batch_sizes[len(rows)] += 1
        last = torch.tensor([[r.output_ids[-1]] for r in rows], device=self.device)
        positions = torch.tensor([[len(r.prompt) + len(r.output_ids) - 1] for r in rows], device=self.device)
        out = self.model(
            input_ids=last,
            attention_mask=self._batch.grow_mask(),
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: self._batch.cache},
            **self._lora(rows),
        )
        self._advance(rows, out.logits[:, -1, :])

    def _lora(self, rows: list[Row]) -> dict[str, Any]:
        """Forward arguments that give each row its adapter (peft's mixed-adapter batches)."""
        if self.model is self.base:
            return {}
        loaded = self.model.peft_config
        return {"adapter_names": [r.adapter if r.adapter in loaded else "__base__" for r in rows]}

    def _advance(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Sample one token for each of `rows` (the batch's last rows), then retire finished rows."""
        tokens, logprobs = sample(
            logits, [r.params for r in rows], [r.generator for r in rows], self._generator, scratch=True
        )
        for row, tok, lp in zip(rows, tokens, logprobs, strict=True):
            row.output_ids.append(tok)
            row.logprobs.append(lp)
            check_finished(row, self.eos_ids, self.context_length, self.tokenizer)
        self.tokens_generated += len(rows)
        first = len(self._batch) - len(rows)
        for i, row in enumerate(rows):
            if row.finish is not None and len(row.output_ids) > 1:
                # its cache holds the prompt and every output token but the last, which was never fed
                kv_of = partial(row_kv, self._batch.cache, self._batch.mask, first + i)
                self._prefix.insert(row.prompt + row.output_ids[:-1], kv_of, row.adapter)
        for row in rows:
            if row.finish is not None:
                self.requests_finished += 1
                settle(row.future, self._output(row))
            elif row.on_step is not None:
                row.on_step(step(row, self._version(row)))
        self._batch.retain([i for i, r in enumerate(self._batch.rows) if r.finish is None])

    def _version(self, row: Row) -> str:
        return self.weight_version if row.adapter is None else self.adapter_versions[row.adapter]

    def _output(self, row: Row) -> GenerationOutput:
        return output(row, self._version(row), self.tokenizer)

    def _abort_all(self, new: list[Row]) -> None:
        pending, swaps = self._batch.rows + new, [self._swap] if self._swap else []
        while not self._queue.empty():
            item = self._queue.get_nowait()  # this thread is the queue's only reader
            if isinstance(item, Row):
                pending.append(item)
            elif isinstance(item, Swap):
                swaps.append(item)
        for swap in swaps:
            swap.done.set_exception(RuntimeError("engine stopped before the reload"))
        for row in pending:
            row.finish = {"type": "abort", "message": "engine shutting down"}
            settle(row.future, self._output(row))
        self._batch.clear()
