"""OpenAI-style API errors raised by the gateway core and rendered by the HTTP and NATS front ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import httpx

from swarmrl.services.engine.client import EngineError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.retry_after_s = retry_after_s
        """Set on a 429: when the request may be made again (HTTP `Retry-After`, NATS `retry_after_s`)."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# Each takes the message (and `bad_request` a `param` and `code`, `rate_limited` its `retry_after_s`).
bad_request = partial(ApiError, 400)
unauthorized = partial(ApiError, 401, code="invalid_api_key")
forbidden = partial(ApiError, 403, type_="permission_error", code="model_not_allowed")
not_found = partial(ApiError, 404, code="model_not_found", param="model")
rate_limited = partial(ApiError, 429, type_="rate_limit_error", code="rate_limit_exceeded")


def check_size(size: int, limit: int) -> None:
    """A 413 for a request of `size` bytes (or more, still arriving) over the gateway's `limit`."""
    if size > limit:
        message = f"request of {size} bytes exceeds the gateway's limit of {limit}"
        raise ApiError(413, message, code="request_too_large")


def server_error(exc: Exception) -> ApiError:
    return ApiError(500, f"{type(exc).__name__}: {exc}", "server_error")


@contextmanager
def engine_errors(model: str) -> Iterator[None]:
    """An engine's failure as the agent's `ApiError`: its refusal (a 4xx) a 400, else a 502."""
    try:
        yield
    except (EngineError, httpx.HTTPError) as exc:  # e.g. a read timeout, which the client does not retry
        status, message = (exc.status, exc.message) if isinstance(exc, EngineError) else (0, repr(exc))
        if 400 <= status < 500:
            raise bad_request(
                f"engine of model {model!r} refused the request: {message}", code="engine_error"
            ) from exc
        raise ApiError(
            502, f"engine of model {model!r} failed: {message}", "server_error", "engine_error"
        ) from exc
