"""Bounds on what a client may ask of the gateway: token lifetimes and completion parameters."""

import math
import time

import msgpack
import pytest

from swarmrl.services.gateway.core import MAX_SEED, Gateway
from swarmrl.services.gateway.errors import ApiError
from swarmrl.services.gateway.tokens import Claims, TokenError, _b64, _sign, check_ttl, mint, verify

SECRET = b"s3cret"
DAY = 24 * 3600.0


@pytest.mark.parametrize("ttl", [math.nan, math.inf, -math.inf, -5.0, 0, 0.0, DAY + 1, 1e300])
def test_token_lifetimes_outside_zero_to_max_are_refused(ttl: float) -> None:
    with pytest.raises(ValueError, match=r"finite, > 0 and <= 86400 s, got"):
        check_ttl(ttl, DAY)


@pytest.mark.parametrize("ttl", ["60", None, True, [60]])
def test_a_token_lifetime_is_a_number(ttl: object) -> None:
    with pytest.raises(ValueError, match="must be a number of seconds"):
        check_ttl(ttl, DAY)


def test_lifetimes_within_bounds_are_kept() -> None:
    assert (check_ttl(60, DAY), check_ttl(0.5, DAY), check_ttl(DAY, DAY)) == (60.0, 0.5, DAY)


def test_a_token_that_would_never_expire_is_neither_minted_nor_accepted() -> None:
    with pytest.raises(ValueError, match="finite"):
        mint(SECRET, Claims("ep1", "a", ("policy",), math.nan))
    # One signed with the secret all the same (by an older gateway): NaN never compares as expired.
    body = _b64(msgpack.packb({"e": "ep1", "a": "a", "m": ["policy"], "x": math.nan}))
    signed = f"swt1.{body}"
    with pytest.raises(TokenError) as err:
        verify(SECRET, f"{signed}.{_sign(SECRET, signed)}")
    assert err.value.code == "expired"
    assert verify(SECRET, mint(SECRET, Claims("ep1", "a", (), time.time() + 60))).agent == "a"


async def _publish(_: object) -> None:
    raise AssertionError("nothing is published by parse")


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"seed": 2**70}, "seed"),
        ({"seed": MAX_SEED + 1}, "seed"),
        ({"seed": -1}, "seed"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
    ],
)
def test_completion_parameters_out_of_range_are_400s(over: dict, param: str) -> None:
    gateway = Gateway({}, SECRET, _publish)
    with pytest.raises(ApiError) as err:
        gateway.parse({"model": "policy", "messages": [{"role": "user", "content": "hi"}], **over})
    assert (err.value.status, err.value.param) == (400, param)


def test_completion_parameters_at_their_bounds_pass() -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "seed": MAX_SEED, "top_k": 1}
    req = Gateway({}, SECRET, _publish).parse({**body, "max_tokens": 2**31 - 1, "temperature": 0})
    assert (req.seed, req.top_k, req.max_tokens) == (MAX_SEED, 1, 2**31 - 1)
