"""HTTP front end: OpenAI-compatible `/v1/chat/completions` (plain and SSE streaming) and `/v1/models`.

Request bodies are capped (`max_request_bytes`, 413 past it) and parsed off the event loop, like the
tokenizing in `core.py`: one client's huge request never stalls the others or `/health`.

With `stream: true` the chunks go out as the engine decodes (`streaming.py`). Every error found before
the engine's first token (auth, bad request, engine refusal) is a plain HTTP error, as for a call
that is not streamed; a failure after it is an SSE `data: {"error": {...}}` event, which the OpenAI
SDKs raise, and the stream ends without `[DONE]`.
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
from swarmrl.services.gateway.core import Gateway
from swarmrl.services.gateway.errors import ApiError, bad_request, too_large
from swarmrl.services.gateway.streaming import ChatStream

log = logging.getLogger("swarmrl.gateway.http")


def _api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("api-key") or None


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body, refused (413) once it is known to pass `limit` bytes: by its
    Content-Length before anything is read, else (chunked) as soon as what arrived passes it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(f"request body of {int(declared)} bytes exceeds the gateway's limit of {limit}")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise too_large(f"request body exceeds the gateway's limit of {limit} bytes")
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
        # a client killed mid-request (the chaos benchmark's SIGKILLs): nobody reads this reply, and
        # nothing failed here; uncaught, uvicorn logs it as a server error with a traceback
        log.info("a client left before its request to %s was read", request.url.path)
        return Response(status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": sorted(gateway.models)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "swarmrl"}
                for name in sorted(gateway.models)
            ],
        }

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
        except Exception as exc:  # an OpenAI-style 500, as over NATS; uncaught, uvicorn drops the connection
            log.exception("completion failed")
            raise ApiError(500, f"{type(exc).__name__}: {exc}", "server_error") from exc
        log.debug("episode=%s call=%s reused=%s", done.event.episode_id, done.event.call_id, done.reused_call)
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
        yield _event(ApiError(500, f"{type(exc).__name__}: {exc}", "server_error").body())
        return
    done = stream.completion
    if done is not None:
        log.debug(
            "episode=%s call=%s reused=%s streamed",
            done.event.episode_id,
            done.event.call_id,
            done.reused_call,
        )
    yield b"data: [DONE]\n\n"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
