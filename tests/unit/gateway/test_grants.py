"""Token requests: per-agent models, defaults, and the errors that name the offending entry."""

import pytest

from swarmrl.services.gateway.grants import parse_token_request

SERVED = ("alpha", "beta", "gamma")


def req(**over):
    return {"episode_id": "ep1", "client_id": "c", "client_version": "v"} | over


def test_every_agent_gets_the_episode_models_by_default() -> None:
    r = parse_token_request(req(models=["alpha", "beta"], agents=["a", "b"]), SERVED)
    assert r.models == ("alpha", "beta")
    assert r.agent_models == {"a": ("alpha", "beta"), "b": ("alpha", "beta")}
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
    assert (r.task, r.group_key, r.eval, r.ttl_s) == ("calculator", "g", True, 5.0)
    assert parse_token_request(req(models=["alpha"]), SERVED).task == ""


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
        ({"models": ["alpha"], "agent_models": ["alpha"]}, "agent_models must be a map"),
        ({"models": "alpha"}, "models must be a list"),
        ({"models": ["alpha"], "task": 3}, "task must be"),
        ({"models": ["alpha"], "episode_id": "a.b"}, "episode id"),
        ({"models": ["alpha"], "agents": [f"a{i}" for i in range(65)]}, "over 64 agents"),
    ],
)
def test_bad_requests_name_the_offending_entry(over, error) -> None:
    with pytest.raises(ValueError, match=error):
        parse_token_request(req(**over), SERVED)
