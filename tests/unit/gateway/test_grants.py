"""Token requests (the wire's `TokenRequest`): per-agent models, defaults, and the errors that name
the offending entry."""

import msgpack
import pytest

from swarmrl.schemas import TokenReply, TokenRequest, WireError, encode
from swarmrl.services.gateway.grants import check_token_request


def parse_token_request(req: dict, served):
    """Check a request as it comes off the wire: a msgpack map."""
    return check_token_request(msgpack.packb(req), served)


SERVED = ("alpha", "beta", "gamma")


def req(**over):
    return {"v": 1, "episode_id": "ep1", "client_id": "c", "client_version": "v"} | over


def test_every_agent_gets_the_episode_models_by_default() -> None:
    r = parse_token_request(req(models=["alpha", "beta"], agents=["a", "b"]), SERVED)
    assert r.models == ("alpha", "beta")
    assert r.agent_models == {"a": ("alpha", "beta"), "b": ("alpha", "beta")}
    assert r.request == TokenRequest(
        episode_id="ep1", client_id="c", client_version="v", models=["alpha", "beta"], agents=["a", "b"]
    )
    assert parse_token_request(req(models=["alpha"]), SERVED).agent_models == {"agent": ("alpha",)}


def test_agent_models_narrow_each_token_and_models_default_to_their_union() -> None:
    r = parse_token_request(req(agent_models={"caller": ["alpha"], "reporter": ["beta", "beta"]}), SERVED)
    assert r.models == ("alpha", "beta")
    assert r.agent_models == {"caller": ("alpha",), "reporter": ("beta",)}
    # Explicit agents and models: an agent not in agent_models may call all of the episode's models.
    r = parse_token_request(
        req(models=["alpha", "beta"], agents=["caller", "judge"], agent_models={"caller": ["alpha"]}), SERVED
    )
    assert r.agent_models == {"caller": ("alpha",), "judge": ("alpha", "beta")}


def test_task_group_and_eval_pass_through() -> None:
    r = parse_token_request(
        req(models=["alpha"], task="calculator", group_key="g", eval=True, ttl_s=5), SERVED
    )
    assert (r.request.task, r.request.group_key, r.request.eval, r.request.ttl_s) == (
        "calculator",
        "g",
        True,
        5.0,
    )
    assert parse_token_request(req(models=["alpha"]), SERVED).request.task == ""


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({}, "names no models"),
        ({"models": []}, "names no models"),
        ({"agent_models": {"a": []}}, "names no models"),
        ({"models": ["nope"]}, r"unknown models \['nope'\]"),
        ({"agent_models": {"a": ["nope"]}}, r"unknown models \['nope'\]"),
        ({"models": ["alpha"], "agent_models": {"a": ["beta"]}}, r"agent_models\['a'\] names \['beta'\]"),
        ({"models": ["alpha"], "agents": ["a"], "agent_models": {"b": ["alpha"]}}, "agent 'b'"),
        (
            {"models": ["alpha"], "agent_models": ["alpha"]},
            "schema: agent_models: Input should be a valid dictionary",
        ),
        ({"models": "alpha"}, "schema: models: Input should be a valid list"),
        ({"models": ["alpha"], "task": 3}, "schema: task: Input should be a valid string"),
        ({"models": ["alpha"], "ttl_s": float("inf")}, "schema: ttl_s: Input should be a finite number"),
        ({"models": ["alpha"], "colour": "red"}, "schema: colour: Extra inputs are not permitted"),
        ({"models": ["alpha"], "episode_id": "a.b"}, "episode id"),
        ({"models": ["alpha"], "agents": [f"a{i}" for i in range(65)]}, "over 64 agents"),
    ],
)
def test_bad_requests_name_the_offending_entry(over, error) -> None:
    with pytest.raises(ValueError, match=error):
        parse_token_request(req(**over), SERVED)


def test_a_reply_carries_only_what_applies() -> None:
    """Readers in other languages test which keys a reply has (`retry_after_s` in it: wait)."""
    assert msgpack.unpackb(encode(TokenReply(retry_after_s=1.5), exclude_none=True)) == {
        "v": 1,
        "retry_after_s": 1.5,
    }
    assert msgpack.unpackb(encode(TokenReply(error="no"), exclude_none=True)) == {"v": 1, "error": "no"}
    with pytest.raises(WireError, match="malformed"):
        check_token_request(b"\xc1", SERVED)
