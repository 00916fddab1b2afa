"""OpenAI-style API errors raised by the gateway core and rendered by the HTTP and NATS front ends."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.retry_after_s: float | None = None
        """Set on a 429: when the request may be made again (HTTP `Retry-After`, NATS `retry_after_s`)."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def forbidden(message: str) -> ApiError:
    return ApiError(403, message, "permission_error", "model_not_allowed")


def not_found(message: str) -> ApiError:
    return ApiError(404, message, "invalid_request_error", "model_not_found", "model")


def too_large(message: str) -> ApiError:
    return ApiError(413, message, "invalid_request_error", "request_too_large")


def rate_limited(message: str, retry_after_s: float) -> ApiError:
    exc = ApiError(429, message, "rate_limit_error", "rate_limit_exceeded")
    exc.retry_after_s = retry_after_s
    return exc


def server_error(exc: Exception) -> ApiError:
    return ApiError(500, f"{type(exc).__name__}: {exc}", "server_error")


def engine_failed(model: str, status: int, message: str) -> ApiError:
    """The engine refused the request (its 4xx: 400 here) or failed or was unreachable (502)."""
    if 400 <= status < 500:
        return ApiError(400, f"engine of model {model!r} refused the request: {message}", code="engine_error")
    return ApiError(502, f"engine of model {model!r} failed: {message}", "server_error", "engine_error")
