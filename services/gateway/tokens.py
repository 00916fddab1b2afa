"""Signed episode tokens: the OpenAI `api_key` an agent uses names its episode, agent and models.

Format: `swt1.<b64url(msgpack claims)>.<b64url(HMAC-SHA256(secret, "swt1." + payload))>`: readable by
anyone (like a JWT), unforgeable without the secret. Pure logic, no NATS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import time
from dataclasses import astuple, dataclass
from typing import Any

import msgpack

PREFIX = "swt1"
CLAIM_KEYS = "eamxcv"
"""The claims' keys in a token, one letter per `Claims` field, in order."""


class TokenError(Exception):
    """The token is malformed, forged, or expired. `code` is `invalid` or `expired`."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class Claims:
    episode_id: str
    agent: str
    models: tuple[str, ...]
    expires_at: float
    client_id: str = ""
    client_version: str = ""

    def allows(self, model: str) -> bool:
        # No models means none: a token never grants "every model" by omission.
        return model in self.models


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, signed_part: str) -> str:
    return _b64(hmac.new(secret, signed_part.encode(), hashlib.sha256).digest())


def check_ttl(ttl_s: Any, max_s: float) -> float:
    """A client's token lifetime in seconds; ValueError unless a finite number in (0, max_s]."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
        raise ValueError(f"ttl_s must be a number of seconds, got {ttl_s!r}")
    if not (math.isfinite(ttl_s) and 0 < ttl_s <= max_s):
        raise ValueError(f"ttl_s must be finite, > 0 and <= {max_s:g} s, got {ttl_s!r}")
    return float(ttl_s)


def mint(secret: bytes, claims: Claims) -> str:
    if not math.isfinite(claims.expires_at):  # NaN: never expires; refuse what no lifetime gives
        raise ValueError(f"token expiry must be a finite time, got {claims.expires_at!r}")
    body = msgpack.packb(dict(zip(CLAIM_KEYS, astuple(claims), strict=True)), use_bin_type=True)
    signed_part = f"{PREFIX}.{_b64(body)}"
    return f"{signed_part}.{_sign(secret, signed_part)}"


def verify(secret: bytes, token: str, now: float | None = None) -> Claims:
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise TokenError("invalid", "not a swarmrl episode token (expected swt1.<claims>.<signature>)")
    signed_part = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_sign(secret, signed_part), parts[2]):
        raise TokenError("invalid", "episode token signature does not verify")
    try:
        raw = msgpack.unpackb(_unb64(parts[1]), raw=False)
        claims = Claims(
            raw["e"], raw["a"], tuple(raw["m"]), float(raw["x"]), raw.get("c", ""), raw.get("v", "")
        )
    except Exception as exc:  # signed but unreadable: only a secret holder could make this
        raise TokenError("invalid", f"episode token claims unreadable: {exc}") from exc
    if not (time.time() if now is None else now) <= claims.expires_at:  # NaN too: never valid
        raise TokenError("expired", f"episode token for {claims.episode_id} expired")
    return claims
