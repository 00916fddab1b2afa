"""SGLang's native HTTP API, the subset swarmrl uses, served by the embedded engine (FastAPI).

Consumes HTTP: `POST /generate`, `POST /update_weights_from_disk`, `GET /health`,
`GET /health_generate`, `GET /get_model_info`, `POST /flush_cache`; plus `GET /engine_stats`,
a swarmrl extension (batching counters). Publishes HTTP responses shaped like SGLang's, so
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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from swarmrl.services.engine.engine_core import EngineCore, GenerationOutput
from swarmrl.services.engine.sampling import SamplingParams

log = logging.getLogger("swarmrl.engine.server")

# Top-level /generate fields we understand; anything else is refused with its name.
_GENERATE_KEYS = {
    "text", "input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs",
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
            prompts, params, want_logprob, rids, single, starts = _parse_generate(engine, body)
            futures = [
                engine.submit(p, sp, rid, start)
                for p, sp, rid, start in zip(prompts, params, rids, starts, strict=True)
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
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"request body is not JSON: {exc}")
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            return _error("update_weights_from_disk needs a non-empty string `model_path`")
        version = body.get("weight_version")
        ok, message = await asyncio.to_thread(
            engine.update_weights_from_disk, path, None if version is None else str(version)
        )
        content = {"success": ok, "message": message, "num_paused_requests": 0}
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
            "model_type": getattr(cfg, "model_type", None),
            "architectures": getattr(cfg, "architectures", None),
        }

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        # No prefix cache is kept across requests, so there is nothing to drop.
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/engine_stats")
    async def engine_stats() -> dict[str, Any]:
        return engine.stats()

    return app


def _parse_generate(
    engine: EngineCore, body: Any
) -> tuple[list[list[int]], list[SamplingParams], list[bool], list[str | None], bool, list[int]]:
    """Validate a /generate body: prompts, params, return_logprob and rids per item, whether single,
    and each item's logprob_start_len (-1 where no input logprobs are asked for)."""
    if not isinstance(body, dict):
        raise ValueError(f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - _GENERATE_KEYS)
    if unknown:
        raise ValueError(f"unsupported /generate fields {unknown}")
    if body.get("stream"):
        raise ValueError("stream=true is not supported by the embedded engine")
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
    return prompts, params, [bool(w) for w in want], rids, single, starts


def _to_sglang(
    engine: EngineCore, out: GenerationOutput, with_logprobs: bool, text_in_lp: bool
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": 0,
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
    return {"text": out.text, "output_ids": out.output_ids, "meta_info": meta}
