import time

import pytest

from swarmrl.services.gateway.tokens import Claims, TokenError, mint, verify

SECRET = b"s3cret"


def test_round_trip_and_claims() -> None:
    tok = mint(SECRET, Claims("ep1", "solver", ("policy",), time.time() + 60, "c1", "v7"))
    claims = verify(SECRET, tok)
    assert (claims.episode_id, claims.agent, claims.models, claims.client_version) == (
        "ep1",
        "solver",
        ("policy",),
        "v7",
    )
    assert claims.allows("policy") and not claims.allows("other")


def test_a_token_without_models_allows_none() -> None:
    claims = verify(SECRET, mint(SECRET, Claims("ep1", "a", (), time.time() + 60)))
    assert claims.models == () and not claims.allows("policy")


def test_forged_tampered_and_expired_tokens_are_refused() -> None:
    tok = mint(SECRET, Claims("ep1", "a", ("policy",), time.time() + 60))
    with pytest.raises(TokenError, match="signature"):
        verify(b"other-secret", tok)
    head, body, sig = tok.split(".")
    forged = mint(b"attacker", Claims("ep1", "a", ("policy", "other"), time.time() + 60)).split(".")[1]
    with pytest.raises(TokenError, match="signature"):
        verify(SECRET, f"{head}.{forged}.{sig}")
    with pytest.raises(TokenError) as err:
        verify(SECRET, mint(SECRET, Claims("ep1", "a", (), time.time() - 1)))
    assert err.value.code == "expired"
    for junk in ("", "sk-123", "swt1.a", '{"episode_id": "ep1"}'):
        with pytest.raises(TokenError):
            verify(SECRET, junk)
