"""SGLang's native HTTP API, the subset swarmrl uses, served by the embedded engine (FastAPI), so that
`EngineClient` drives it and a real SGLang server alike; plus `GET /engine_stats`, swarmrl's counters.

Shapes are SGLang 0.5's (`managers/io_struct.py`): `output_token_logprobs` `[[logprob, token_id,
text_or_null], ...]`, `finish_reason` `{"type": "stop"|"length"|"abort", ...}`, errors
`{"error": {"message": ...}}`. With `logprob_start_len` >= 0, `input_token_logprobs` covers
`input_ids[logprob_start_len:]`, the first None; `max_new_tokens: 0` only scores the prompt.
`"stream": true` sends SGLang's cumulative SSE events, one per decode step (text ending inside a
character held back), then `data: [DONE]`; a client that disconnects aborts its request.
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
            requests, want_logprob, single = _parse_generate(engine, body)
            text_in_lp = bool(body.get("return_text_in_logprobs"))
            if body.get("stream"):
                stream = engine.stream(**requests[0])
                skip_special = requests[0]["params"].skip_special_tokens
                events = _sse(engine, stream, want_logprob[0], text_in_lp, skip_special)
                # the background task runs even when the client left mid-stream (SGLang's abort task)
                return StreamingResponse(
                    events, media_type="text/event-stream", background=BackgroundTask(stream.abort)
                )
            futures = [engine.submit(**r) for r in requests]
        except ValueError as exc:  # includes malformed JSON
            return _error(str(exc))
        except RuntimeError as exc:  # the engine is shutting down
            return _error(str(exc), 503)
        try:
            outputs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except RuntimeError as exc:  # the forward pass failed; the engine logged it
            return _error(str(exc), 500)
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
        # SGLang's body plus `weight_version`; a loaded name is replaced in place (SGLang wants an unload)
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


def _parse_generate(engine: EngineCore, body: Any) -> tuple[list[dict[str, Any]], list[bool], bool]:
    """Validate a /generate body: each item's `EngineCore.submit` arguments (`lora_path`, SGLang's
    field, names the adapter), its return_logprob, and whether the body held a single item."""
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
    params = [SamplingParams.from_dict(p, engine.vocab_size) for p in _each(body, "sampling_params", n)]
    want = [bool(w) for w in _each(body, "return_logprob", n, False)]
    rid = body.get("rid")
    if single or isinstance(rid, list):
        rids = _each(body, "rid", n)
    else:
        rids = [f"{rid}_{i}" if rid else None for i in range(n)]
    starts = _each(body, "logprob_start_len", n, -1)
    starts = [s if w else -1 for s, w in zip(starts, want, strict=True)]  # SGLang: only with return_logprob
    for i, (p, start) in enumerate(zip(prompts, starts, strict=True)):
        if not isinstance(p, list):
            raise ValueError(f"input_ids[{i}] must be a list of token ids")
        try:  # all checked before any is queued: a bad item must not cost compute
            engine.check_prompt(p)
            engine.check_logprob_start(start, len(p))
        except ValueError as exc:
            raise ValueError(f"prompt {i}: {exc}" if n > 1 else str(exc)) from None
    if stream and not single:
        raise ValueError(f"stream=true takes one prompt, got a batch of {n}: send one request per prompt")
    loras = _each(body, "lora_path", n)
    for name in loras:
        engine.check_adapter(name)
    items = zip(prompts, params, rids, starts, loras, strict=True)
    keys = ("input_ids", "params", "rid", "logprob_start_len", "adapter")
    return [dict(zip(keys, item, strict=True)) for item in items], want, single


def _each(body: dict[str, Any], key: str, n: int, default: Any = None) -> list[Any]:
    """Field `key` per prompt: given as a list of one per prompt, or one value (or `default`) for all."""
    value = body.get(key)
    values = value if isinstance(value, list) else [default if value is None else value] * n
    if len(values) != n:
        raise ValueError(f"{key} has {len(values)} entries for {n} prompts")
    return values


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
    if isinstance(out, GenerationOutput):
        text, finish = out.text, out.finish_reason
    else:  # running: the text so far, less a trailing incomplete character (it decodes to U+FFFD)
        text, finish = "", None
        if engine.tokenizer is not None:
            text = engine.tokenizer.decode(out.output_ids, skip_special_tokens=skip_special).rstrip("\ufffd")
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

        def entries(lps: list[Any], ids: list[int]) -> list[list[Any]]:
            return [
                [lp, t, tok.decode([t]) if tok is not None else None] for lp, t in zip(lps, ids, strict=True)
            ]

        meta["output_token_logprobs"] = entries(out.output_logprobs, out.output_ids)
        meta["input_token_logprobs"] = entries(out.input_logprobs, out.input_logprob_ids)  # [] if not asked
    return {"text": text, "output_ids": out.output_ids, "meta_info": meta}
