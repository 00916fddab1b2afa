"""HTTP front end: OpenAI-compatible `/v1/chat/completions` (plain and SSE streaming) and `/v1/models`."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarmrl.services.gateway.core import Gateway, stream_chunks
from swarmrl.services.gateway.errors import ApiError, bad_request

log = logging.getLogger("swarmrl.gateway.http")


def _api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("api-key") or None


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="swarmrl gateway", version="1")

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

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
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"request body is not JSON: {exc}") from exc
        done = await gateway.complete(body, _api_key(request))
        log.debug("episode=%s call=%s reused=%s", done.event.episode_id, done.event.call_id, done.reused_call)
        if not (isinstance(body, dict) and body.get("stream")):
            return JSONResponse(done.response)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def sse() -> AsyncIterator[bytes]:
            for chunk in stream_chunks(done.response, include_usage):
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app
