"""Async client for SGLang's native HTTP API (`server.py` has the fields): drives the embedded engine
and a real SGLang server alike. Connection failures are retried with backoff (a stream only until its
answer begins); an answer the server gave (4xx/5xx, or an `{"error": ...}` stream event) is raised
at once as `EngineError` with the server's own message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from swarmrl.services.common.retry import backoff

# The request may never have reached the engine; generation has no side effects, so resending is safe.
_RETRYABLE = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError
)  # fmt: skip


class EngineError(RuntimeError):
    """The engine answered with an error (`status` is the HTTP status; 0 if it never answered)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"engine error {status}: {message}" if status else message)
        self.status = status
        self.message = message


@dataclass
class GenerateResult:
    """One generation, normalised from SGLang's `{text, output_ids, meta_info}` response."""

    output_ids: list[int]
    output_logprobs: list[float]  # one per output id; empty when return_logprob was false
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    weight_version: int | None  # None when the server's version is not a number (SGLang's "default")
    matched: int | str | None = None  # the stop token id or stop string that ended it, if any
    input_logprobs: list[float | None] = field(default_factory=list)
    """`meta_info.input_token_logprobs` values: one per prompt token from `logprob_start_len`, first None."""
    meta_info: dict[str, Any] = field(default_factory=dict, repr=False)
    finished: bool = True
    """False for a streamed request's intermediate results (`finish_reason` is then "")."""

    @classmethod
    def from_response(cls, item: dict[str, Any]) -> GenerateResult:
        meta = item.get("meta_info") or {}
        token_lps = meta.get("output_token_logprobs") or []
        ids = item.get("output_ids")
        if ids is None:  # SGLang releases before output_ids was returned with text
            if not token_lps:
                raise EngineError(
                    0, f"response has neither output_ids nor output_token_logprobs: {list(item)}"
                )
            ids = [int(entry[1]) for entry in token_lps]
        finish = meta.get("finish_reason") or {}
        return cls(
            output_ids=list(ids),
            output_logprobs=[float(entry[0]) for entry in token_lps],
            text=item.get("text") or "",
            finish_reason=str(finish.get("type", "abort")),
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            weight_version=parse_weight_version(meta.get("weight_version")),
            matched=finish.get("matched"),
            input_logprobs=[
                None if entry[0] is None else float(entry[0])
                for entry in meta.get("input_token_logprobs") or []
            ],
            meta_info=meta,
        )


class StreamAccumulator:
    """Folds SGLang's streamed `/generate` events into cumulative `GenerateResult`s.

    SGLang's events are cumulative by default and hold only what is new with
    `--incremental-streaming-output`; `meta_info.completion_tokens` (all tokens so far, in both) tells
    them apart. Input logprobs are read from the final event only.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""

    def add(self, item: Any) -> GenerateResult:
        """The request's result so far after `item`, one decoded `data:` event."""
        if not isinstance(item, dict):
            raise EngineError(0, f"stream event is not a JSON object: {str(item)[:200]}")
        raise_stream_error(item)
        meta = item.get("meta_info") or {}
        entries = meta.get("output_token_logprobs")
        ids = item.get("output_ids")
        if ids is None:  # SGLang releases that stream no output_ids: the logprob entries name them
            ids = [int(e[1]) for e in entries or []]
        total = meta.get("completion_tokens")
        delta = isinstance(total, int) and len(ids) < total and len(self.ids) + len(ids) == total
        if delta:
            self.ids += ids
            self.text += item.get("text") or ""
        else:
            self.ids = list(ids)
            self.text = item.get("text") or self.text  # None: SGLang filled in no text this time
        if entries is not None:
            if delta:  # SGLang slices the logprobs where it slices the ids
                self.logprobs += [float(e[0]) for e in entries]
            else:  # cumulative: convert only the entries not seen before
                self.logprobs = self.logprobs[: len(entries)]
                self.logprobs += [float(e[0]) for e in entries[len(self.logprobs) :]]
        whole = {"text": self.text, "output_ids": self.ids, "meta_info": meta}
        if meta.get("finish_reason") is not None:
            result = GenerateResult.from_response(whole)
            return replace(result, output_logprobs=list(self.logprobs) if entries is not None else [])
        partial = {**whole, "meta_info": {**meta, "output_token_logprobs": [], "input_token_logprobs": []}}
        result = GenerateResult.from_response(partial)
        return replace(result, output_logprobs=list(self.logprobs), finish_reason="", finished=False)


def raise_stream_error(item: dict[str, Any]) -> None:
    """Raise the EngineError of an `{"error": ...}` stream event (how SGLang and vLLM end a stream
    they refuse mid-way)."""
    if "error" in item:
        err = item["error"]
        raise EngineError(400, str(err.get("message", err) if isinstance(err, dict) else err))


def parse_weight_version(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class EngineClient:
    """One engine's HTTP API. Use as `async with EngineClient(url) as engine: ...`."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 600.0,
        retries: int = 5,
        retry_s: float | None = None,
        adapter: str | None = None,
        max_inflight: int = 0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.adapter = adapter
        """A LoRA adapter of the engine that generations run with (`lora_path`), reloads load and
        `model_info` reports the version of. None: the base."""
        self.retries = retries
        self.retry_s = retry_s
        """Retry connection failures this long instead of `retries` times: ride out an engine restart."""
        self.max_inflight = max_inflight
        """Requests sent at once (0: no bound); more wait here, first come first served. httpx's pool
        costs CPU per connection in flight (bench/results/load.md); each request in flight keeps its
        own connection alive, closed when idle before the server's keep-alive ends."""
        self._slot: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Semaphore(max_inflight) if max_inflight > 0 else contextlib.nullcontext()
        )
        cap = max_inflight or None
        limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap, keepalive_expiry=30)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, limits=limits)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None = None, return_logprob: bool = True
    ) -> GenerateResult:
        """Generate from one prompt of token ids."""
        body = self._generate_body(input_ids, sampling_params, return_logprob)
        return GenerateResult.from_response(await self._call("POST", "/generate", body))

    def _generate_body(self, input_ids: Any, sampling_params: Any, return_logprob: bool) -> dict[str, Any]:
        return {
            "input_ids": input_ids,
            "sampling_params": sampling_params or {},
            "return_logprob": return_logprob,
            **({} if self.adapter is None else {"lora_path": self.adapter}),
        }

    async def generate_stream(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None = None, return_logprob: bool = True
    ) -> AsyncIterator[GenerateResult]:
        """Generate from one prompt, streamed: a cumulative result after each event (`finished`
        False), the last one what `generate` returns. Leaving early closes the connection, which
        makes the server abort the request."""
        body = {**self._generate_body(input_ids, sampling_params, return_logprob), "stream": True}
        async for result in self._stream("/generate", body, StreamAccumulator().add):
            yield result

    async def _stream(
        self, path: str, body: dict[str, Any], fold: Callable[[Any], GenerateResult]
    ) -> AsyncIterator[GenerateResult]:
        """POST `body` for a server-sent event stream, `fold` each `data:` event into the result so far
        and yield it; the finished one comes once the body has ended (read just past `[DONE]`: the
        connection is then reused). An HTTP error is an EngineError; leaving early closes the connection."""
        final: GenerateResult | None = None
        async with self._slot:
            resp = await self._retrying(
                lambda: self._http.send(self._http.build_request("POST", path, json=body), stream=True)
            )
            try:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise EngineError(resp.status_code, _error_message(resp))
                async for line in resp.aiter_lines():
                    # skip blank separators, SSE comments, other fields, [DONE] and all after the final event
                    if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]" or final:
                        continue
                    try:
                        item = json.loads(data)
                    except ValueError as exc:
                        raise EngineError(
                            0, f"engine sent a stream event that is not JSON: {data[:200]!r}"
                        ) from exc
                    result = fold(item)
                    if result.finished:
                        final = result
                    else:
                        yield result
            finally:
                await resp.aclose()
        if final is None:
            raise EngineError(0, f"engine stream from {self.base_url} ended before the request finished")
        yield final

    async def generate_batch(
        self,
        input_ids: list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        return_logprob: bool = True,
        logprob_start_len: int | list[int] | None = None,
    ) -> list[GenerateResult]:
        """Generate from several prompts in one request (the server batches them). `logprob_start_len`
        (one, or one per prompt) also asks for input logprobs from that position; with
        `max_new_tokens: 0` nothing is generated."""
        body = self._generate_body(input_ids, sampling_params, return_logprob)
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        data = await self._call("POST", "/generate", body)
        if not isinstance(data, list) or len(data) != len(input_ids):
            raise EngineError(0, f"batch of {len(input_ids)} prompts got a {type(data).__name__} back")
        return [GenerateResult.from_response(item) for item in data]

    async def update_weights_from_disk(self, path: str, version: int | str | None = None) -> str:
        """Reload weights from an HF directory (with `adapter`: that adapter from a peft adapter
        directory); EngineError if the engine refused them."""
        if self.adapter is not None:
            return await self.load_lora_adapter(self.adapter, path, version)
        return await self._reload("/update_weights_from_disk", {"model_path": str(path)}, version)

    async def load_lora_adapter(self, name: str, path: str, version: int | str | None = None) -> str:
        """Load LoRA adapter `name` from a peft adapter directory (the embedded engine replaces a
        loaded one in place)."""
        return await self._reload("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, version)

    async def _reload(self, endpoint: str, body: dict[str, Any], version: int | str | None) -> str:
        """POST a reload; EngineError with the engine's reason if it answers `success: false`."""
        what = f"{endpoint.lstrip('/')}({', '.join(map(str, body.values()))})"
        if version is not None:
            body["weight_version"] = str(version)  # SGLang types it Optional[str]
        data = await self._call("POST", endpoint, body)
        if not data.get("success"):
            raise EngineError(200, f"{what} failed: {data.get('error_message') or data.get('message')}")
        return str(data.get("message", ""))

    async def model_info(self) -> dict[str, Any]:
        """`/get_model_info`; with `adapter`, its weight_version is the adapter's."""
        info = await self._call("GET", "/get_model_info")
        if self.adapter is not None and isinstance(info, dict):
            versions = info.get("adapters") or {}
            if self.adapter not in versions:
                have = sorted(versions)
                raise EngineError(
                    404, f"engine at {self.base_url} serves no LoRA adapter {self.adapter!r} (has {have})"
                )
            info = {**info, "weight_version": versions[self.adapter]}
        return info

    async def flush_cache(self) -> None:
        await self._call("POST", "/flush_cache")

    async def health(self) -> bool:
        """True if the server answers /health now (no retries)."""
        try:
            return (await self._http.get("/health")).status_code == 200
        except httpx.TransportError:
            return False

    async def health_generate(self) -> bool:
        """True if the engine generates one token now (what SGLang's `/health_generate` does)."""
        try:
            await self.generate([0], {"max_new_tokens": 1}, return_logprob=False)
        except EngineError:
            return False
        return True

    async def wait_ready(self, timeout: float = 120.0, interval: float = 0.2) -> None:
        """Poll /health until it answers 200; TimeoutError naming the URL after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await self.health():
            if loop.time() > deadline:
                raise TimeoutError(f"engine at {self.base_url} not healthy after {timeout}s")
            await asyncio.sleep(interval)

    async def _retrying(self, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        """`send()`, its connection failures retried with backoff: `retries` attempts in all, or for
        `retry_s`; then `EngineError` naming the engine and the last failure."""
        tries, seconds = (self.retries, None) if self.retry_s is None else (None, self.retry_s)
        try:
            return await backoff(send, transient=_RETRYABLE, tries=tries, seconds=seconds, first_s=0.2)
        except _RETRYABLE as exc:
            tried = f"{self.retries} attempts" if self.retry_s is None else f"{self.retry_s:g} s"
            raise EngineError(0, f"engine at {self.base_url} unreachable for {tried}: {exc!r}") from exc

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async def send() -> httpx.Response:
            async with self._slot:
                return await self._http.request(method, path, json=body)

        resp = await self._retrying(send)
        if resp.status_code >= 400:
            raise EngineError(resp.status_code, _error_message(resp))
        if "json" not in resp.headers.get("content-type", ""):
            return resp.text
        return resp.json()


async def open_engine(
    url: str, *, backend: str = "auto", timeout_s: float = 600.0, wait: bool = True, **kwargs: Any
) -> EngineClient:
    """A client for the engine at `url`: `EngineClient` for SGLang's API, `VLLMClient` for vLLM's.
    `backend="auto"` asks the server (only SGLang's API answers `/get_model_info`), after waiting up
    to `timeout_s` for `/health` if `wait`; an engine that does not answer gets `EngineClient`."""
    async with EngineClient(url, **kwargs) as probe:
        if wait:
            await probe.wait_ready(timeout=timeout_s)
        if backend == "auto":
            try:
                found = (await probe._http.get("/get_model_info")).status_code == 200
            except httpx.TransportError:
                found = True
            backend = "sglang" if found else "vllm"
    if backend == "vllm":
        from swarmrl.services.engine.vllm_backend import VLLMClient

        return VLLMClient(url, **kwargs)
    return EngineClient(url, **kwargs)


def _error_message(resp: httpx.Response) -> str:
    """SGLang's errors are `{"error": {"message": ...}}`, failed reloads `{"success": false, "message"}`."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:2000] or resp.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in data:
            return str(data["message"])
        if "detail" in data:  # FastAPI's own validation errors
            return str(data["detail"])
    return str(data)[:2000]
