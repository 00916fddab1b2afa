"""SGLang's native HTTP API, the subset swarmrl uses, served by the embedded engine (FastAPI).

Consumes HTTP: `POST /generate`, `POST /update_weights_from_disk`, `POST /load_lora_adapter`, `GET /health`,
`GET /health_generate`, `GET /get_model_info`, `POST /flush_cache`; plus `GET /engine_stats`,
a swarmrl extension (batching and prefix-cache counters). Publishes HTTP responses shaped like SGLang's, so
`EngineClient` and the gateway drive this server and a real SGLang server with the same code.

Field names checked against sgl-project/sglang 0.5.x (`managers/io_struct.py` GenerateReqInput /
UpdateWeightFromDiskReqInput @001067ff, `entrypoints/http_server.py`, `managers/tokenizer_manager.py`
meta_info): `meta_info.output_token_logprobs` is `[[logprob, token_id, text_or_null], ...]`,
`finish_reason` is `{"type": "stop"|"length"|"abort", "matched"|"length"|"message": ...}`,
`weight_version` is a string. Errors are HTTP 400 with `{"error": {"message": ...}}`, as SGLang's.

Input logprobs (`return_logprob` with `logprob_start_len` >= 0, an int or one per prompt) follow
SGLang's scheduler (`managers/scheduler.py` handle_generate_request and
`scheduler_output_processor_mixin.py` `_process_input_token_logprobs` @004ec010):
`meta_info.input_token_logprobs` has one `[logprob, token_id, text_or_null]` per token of
`input_ids[logprob_start_len:]`, the first logprob always None; entry i is log p(token i | tokens
before it). A start past the prompt is refused (SGLang aborts it). `-1`, the default, returns none
(`[]`). With `max_new_tokens: 0` the prompt is only scored: one batched forward, no decoding.

Streaming (`"stream": true`, one prompt) follows SGLang's default stream, checked against
sgl-project/sglang `entrypoints/http_server.py` generate_request @0025436e and
`managers/tokenizer_manager.py` `_handle_batch_output` / `_wait_one_response` @001067ff: an SSE
body of `data: {...}\n\n` events, one per decode step, then `data: [DONE]\n\n`. Each event is
shaped like the non-streamed response and is cumulative (SGLang's default,
`incremental_streaming_output=False`): `text` and `output_ids` hold everything generated so far,
`meta_info.output_token_logprobs` every logprob so far, `completion_tokens` their count, and
`finish_reason` is null until the last event, which equals the non-streamed response. Text that
ends inside a multi-byte character is held back until the character is complete, as SGLang's
detokenizer does. A failed forward sends `data: {"error": {"message": ...}}` before `[DONE]`, as
SGLang does; unlike SGLang, a request refused by validation is a plain HTTP 400 before any event.
A client that disconnects aborts its request, like SGLang's `create_abort_task`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.outputs import GenerationOutput, RequestStream, Step
from swarmrl.services.engine.sampling import SamplingParams

log = logging.getLogger("swarmrl.engine.server")

# Top-level /generate fields we understand; anything else is refused with its name.
_GENERATE_KEYS = {
    "text", "input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs", "lora_path",
}  # fmt: skip


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def create_app(engine: EngineCore) -> FastAPI:
    """The FastAPI app over `engine`; the engine's scheduler thread does the work, not the event loop."""
    app = FastAPI(title="swarmrl embedded engine")

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
            prompts, params, want_logprob, rids, single, starts, loras = _parse_generate(engine, body)
            if body.get("stream"):
                stream = engine.stream(prompts[0], params[0], rids[0], starts[0], loras[0])
                text_in_lp = bool(body.get("return_text_in_logprobs"))
                events = _sse(engine, stream, want_logprob[0], text_in_lp, params[0].skip_special_tokens)
                # the background task runs even when the client left mid-stream (SGLang's abort task)
                return StreamingResponse(
                    events, media_type="text/event-stream", background=BackgroundTask(stream.abort)
                )
            futures = [
                engine.submit(p, sp, rid, start, adapter=lora)
                for p, sp, rid, start, lora in zip(prompts, params, rids, starts, loras, strict=True)
            ]
        except ValueError as exc:  # includes malformed JSON
            return _error(str(exc))
        except RuntimeError as exc:  # the engine is shutting down
            return _error(str(exc), 503)
        try:
            outputs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except RuntimeError as exc:  # the forward pass failed; the engine logged it
            return _error(str(exc), 500)
        text_in_lp = bool(body.get("return_text_in_logprobs"))
        out = [_to_sglang(engine, o, lp, text_in_lp) for o, lp in zip(outputs, want_logprob, strict=True)]
        return JSONResponse(out[0] if single else out)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        parsed = await _reload_body(request, "update_weights_from_disk", "model_path")
        if isinstance(parsed, Response):
            return parsed
        (path,), version = parsed
        ok, message = await asyncio.to_thread(engine.update_weights_from_disk, path, version)
        content = {"success": ok, "message": message, "num_paused_requests": 0}
        return JSONResponse(content, status_code=200 if ok else 400)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        # SGLang's body {lora_name, lora_path}, plus `weight_version` (the adapter's version to report);
        # loading a name that is loaded replaces its weights in place (SGLang wants an unload first).
        parsed = await _reload_body(request, "load_lora_adapter", "lora_name", "lora_path")
        if isinstance(parsed, Response):
            return parsed
        (name, path), version = parsed
        ok, message = await asyncio.to_thread(engine.load_lora_adapter, name, path, version)
        content = {"success": ok, "error_message": "" if ok else message, "message": message,
                   "loaded_adapters": dict(engine.adapter_versions)}  # fmt: skip
        return JSONResponse(content, status_code=200 if ok else 400)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        # SGLang runs a one-token generation here: it proves the model answers, not just the socket
        try:
            await engine.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
        except RuntimeError as exc:
            return Response(content=str(exc), status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        cfg = engine.model.config
        return {
            "model_path": engine.model_path,
            "tokenizer_path": engine.tokenizer_path,
            "is_generation": True,
            "weight_version": engine.weight_version,
            "adapters": dict(engine.adapter_versions),  # swarmrl's: LoRA adapter name -> weight_version
            "model_type": getattr(cfg, "model_type", None),
            "architectures": getattr(cfg, "architectures", None),
        }

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        engine.flush_cache()
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/engine_stats")
    async def engine_stats() -> dict[str, Any]:
        return engine.stats()

    return app


async def _reload_body(
    request: Request, endpoint: str, *keys: str
) -> tuple[list[str], str | None] | Response:
    """A reload request's non-empty string fields `keys` and its optional `weight_version` (as a
    string), or the 400 saying what is wrong with the body."""
    try:
        body = await request.json()
    except ValueError as exc:
        return _error(f"request body is not JSON: {exc}")
    found = [body.get(k) if isinstance(body, dict) else None for k in keys]
    values = [v for v in found if isinstance(v, str) and v]
    if len(values) < len(keys):
        names = " and ".join(f"`{k}`" for k in keys)
        return _error(
            f"{endpoint} needs {'a non-empty string' if len(keys) == 1 else 'non-empty strings'} {names}"
        )
    version = body.get("weight_version")
    return values, None if version is None else str(version)


def _parse_generate(
    engine: EngineCore, body: Any
) -> tuple[
    list[list[int]], list[SamplingParams], list[bool], list[str | None], bool, list[int], list[str | None]
]:
    """Validate a /generate body: prompts, params, return_logprob and rids per item, whether single,
    each item's logprob_start_len (-1 where no input logprobs are asked for) and LoRA adapter
    (`lora_path`, SGLang's field: an adapter's name; None: the base)."""
    if not isinstance(body, dict):
        raise ValueError(f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - _GENERATE_KEYS)
    if unknown:
        raise ValueError(f"unsupported /generate fields {unknown}")
    stream = body.get("stream")
    if not isinstance(stream, bool | None):
        raise ValueError(f"stream must be true or false, got {stream!r}")
    if body.get("top_logprobs_num"):
        raise ValueError("top_logprobs_num > 0 is not supported by the embedded engine")
    if (body.get("input_ids") is None) == (body.get("text") is None):
        raise ValueError("give exactly one of `input_ids` or `text`")
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise ValueError("input_ids must be a non-empty list of token ids (or a list of such lists)")
        single = not isinstance(ids[0], list)
        prompts = [ids] if single else ids
    else:
        text = body["text"]
        single = isinstance(text, str)
        texts = [text] if single else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a non-empty list of strings")
        prompts = [engine.encode(t) for t in texts]
    n = len(prompts)
    raw_params = body.get("sampling_params")
    if isinstance(raw_params, list):
        if len(raw_params) != n:
            raise ValueError(f"sampling_params has {len(raw_params)} entries for {n} prompts")
    else:
        raw_params = [raw_params] * n
    params = [SamplingParams.from_dict(p, engine.vocab_size) for p in raw_params]
    lp = body.get("return_logprob") or False
    want = lp if isinstance(lp, list) else [bool(lp)] * n
    if len(want) != n:
        raise ValueError(f"return_logprob has {len(want)} entries for {n} prompts")
    rid = body.get("rid")
    rids = (
        rid
        if isinstance(rid, list)
        else ([rid] if single else [f"{rid}_{i}" if rid else None for i in range(n)])
    )
    if len(rids) != n:
        raise ValueError(f"rid has {len(rids)} entries for {n} prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, list):
            raise ValueError(f"input_ids[{i}] must be a list of token ids")
        try:
            engine.check_prompt(p)
        except ValueError as exc:  # checked before any is queued: a bad item must not cost compute
            raise ValueError(f"prompt {i}: {exc}" if n > 1 else str(exc)) from None
    raw_start = body.get("logprob_start_len")
    starts = raw_start if isinstance(raw_start, list) else [-1 if raw_start is None else raw_start] * n
    if len(starts) != n:
        raise ValueError(f"logprob_start_len has {len(starts)} entries for {n} prompts")
    starts = [s if w else -1 for s, w in zip(starts, want, strict=True)]  # SGLang: only with return_logprob
    for i, (s, p) in enumerate(zip(starts, prompts, strict=True)):
        try:
            engine.check_logprob_start(s, len(p))
        except ValueError as exc:
            raise ValueError(f"prompt {i}: {exc}" if n > 1 else str(exc)) from None
    if stream and not single:
        raise ValueError(f"stream=true takes one prompt, got a batch of {n}: send one request per prompt")
    lora = body.get("lora_path")
    loras = lora if isinstance(lora, list) else [lora] * n
    if len(loras) != n:
        raise ValueError(f"lora_path has {len(loras)} entries for {n} prompts")
    for name in loras:
        engine.check_adapter(name)
    return prompts, params, [bool(w) for w in want], rids, single, starts, loras


async def _sse(
    engine: EngineCore, stream: RequestStream, with_logprobs: bool, text_in_lp: bool, skip_special: bool
) -> AsyncIterator[bytes]:
    """SGLang's SSE events for one streamed request (see the module docstring)."""
    try:
        async for item in stream:
            yield _event(_to_sglang(engine, item, with_logprobs, text_in_lp, skip_special))
    except RuntimeError as exc:  # the forward pass failed; the engine logged it
        yield _event({"error": {"message": str(exc)}})
    yield b"data: [DONE]\n\n"


def _event(obj: dict[str, Any]) -> bytes:
    # the encoding of Starlette's JSONResponse, which the non-streamed answers use
    data = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def _to_sglang(
    engine: EngineCore,
    out: GenerationOutput | Step,
    with_logprobs: bool,
    text_in_lp: bool,
    skip_special: bool = True,
) -> dict[str, Any]:
    """SGLang's `{text, output_ids, meta_info}` for a finished request, or for a running one's `Step`."""
    if isinstance(out, Step):
        text, finish = _partial_text(engine, out.output_ids, skip_special), None
    else:
        text, finish = out.text, out.finish_reason
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": finish,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
        "weight_version": out.weight_version,
    }
    if with_logprobs:
        tok = engine.tokenizer if text_in_lp else None
        meta["output_token_logprobs"] = [
            [lp, tid, tok.decode([tid]) if tok is not None else None]
            for lp, tid in zip(out.output_logprobs, out.output_ids, strict=True)
        ]
        # empty when logprob_start_len=-1 (SGLang's default): none asked for
        meta["input_token_logprobs"] = [
            [lp, tid, tok.decode([tid]) if tok is not None else None]
            for lp, tid in zip(out.input_logprobs, out.input_logprob_ids, strict=True)
        ]
    return {"text": text, "output_ids": out.output_ids, "meta_info": meta}


def _partial_text(engine: EngineCore, ids: list[int], skip_special: bool) -> str:
    """The text of a running request, less a trailing incomplete character (which decodes to U+FFFD)."""
    if engine.tokenizer is None:
        return ""
    return engine.tokenizer.decode(ids, skip_special_tokens=skip_special).rstrip("\ufffd")
