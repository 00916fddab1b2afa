"""HTTP front end: OpenAI-compatible `/v1/chat/completions` (plain and SSE streaming) and `/v1/models`.

Request bodies are capped (`max_request_bytes`) and parsed off the event loop. A streamed call's errors
before the engine's first token are plain HTTP errors; after it, an SSE `data: {"error": ...}` event
ends the stream without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from swarmrl.services.gateway.config import MAX_REQUEST_BYTES
from swarmrl.services.gateway.core import Completion, Gateway
from swarmrl.services.gateway.errors import ApiError, bad_request, check_size, server_error
from swarmrl.services.gateway.streaming import ChatStream

log = logging.getLogger("swarmrl.gateway.http")


def _api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("api-key") or None


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body; 413 by its Content-Length, or as soon as a chunked body passes `limit`."""
    declared = request.headers.get("content-length", "")
    check_size(int(declared) if declared.isdigit() else 0, limit)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        check_size(len(raw), limit)
    try:
        return await asyncio.to_thread(json.loads, raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"request body is not JSON: {exc}") from exc


def create_app(gateway: Gateway, max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    app = FastAPI(title="swarmrl gateway", version="1")

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {}
        if exc.retry_after_s is not None:  # whole seconds (RFC 9110), and the exact wait in ms (OpenAI's)
            headers = {"retry-after": str(math.ceil(exc.retry_after_s)),
                       "retry-after-ms": str(math.ceil(1000 * exc.retry_after_s))}  # fmt: skip
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, _: ClientDisconnect) -> Response:
        # nobody reads this reply and nothing failed here (uncaught, uvicorn logs a traceback)
        log.info("a client left before its request to %s was read", request.url.path)
        return Response(status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": sorted(gateway.models)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "swarmrl"} for m in sorted(gateway.models)
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        body = await read_json(request, max_request_bytes)
        try:
            call = await gateway.prepare(body, _api_key(request))
            if call.req.stream:
                include_usage = bool((call.req.stream_options or {}).get("include_usage"))
                stream = ChatStream(gateway, call, include_usage)
                try:
                    await stream.start()
                except BaseException:
                    await stream.aclose()
                    raise
                # the background task runs even when the client left mid-stream: release the engine
                return StreamingResponse(
                    _sse(stream), media_type="text/event-stream", background=BackgroundTask(stream.aclose)
                )
            done = await gateway.generate(call)
        except ApiError:
            raise
        except Exception as exc:  # an OpenAI-style 500; uncaught, uvicorn drops the connection
            log.exception("completion failed")
            raise server_error(exc) from exc
        _log_done(done)
        return JSONResponse(done.response)

    return app


async def _sse(stream: ChatStream) -> AsyncIterator[bytes]:
    """The SSE body of a streamed call: its chunks, then `[DONE]`; a failure ends it with an error event."""
    try:
        async for chunk in stream.chunks():
            yield _event(chunk)
    except ApiError as exc:
        log.warning("call=%s stream failed: %s", stream.call.call_id, exc.message)
        yield _event(exc.body())
        return
    except Exception as exc:  # the response has begun: the error can only be an event in it
        log.exception("call=%s stream failed", stream.call.call_id)
        yield _event(server_error(exc).body())
        return
    if stream.completion is not None:
        _log_done(stream.completion, " streamed")
    yield b"data: [DONE]\n\n"


def _log_done(done: Completion, how: str = "") -> None:
    log.debug(
        "episode=%s call=%s reused=%s%s", done.event.episode_id, done.event.call_id, done.reused_call, how
    )


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
