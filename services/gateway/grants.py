"""Token requests (`swarm.auth.token.<client>`): check one and resolve which models each agent may call.

An episode names its models; by default every agent may call all of them. `agent_models` narrows
that per agent (a team where the caller runs on one model and the reporter on another): each agent's
token then names only its own models. Pure logic, no NATS; see schemas/README.md "Episode tokens".
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from swarmrl.schemas import subjects as S

MAX_AGENTS = 64
"""Agents per episode: the gateway signs one token each, so a request may not ask for thousands."""


@dataclass(frozen=True)
class TokenRequest:
    episode_id: str
    models: tuple[str, ...]
    """The episode's models: `models`, or the union of `agent_models` when that is empty."""
    agent_models: dict[str, tuple[str, ...]]
    """Every agent of the episode (in request order) → the models its token names."""
    group_key: str
    task: str
    eval: bool
    ttl_s: float
    client_id: str
    client_version: str


def _names(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings, got {value!r}")
    return list(dict.fromkeys(value))  # de-duplicated, order kept


def parse_token_request(req: Any, served: Collection[str]) -> TokenRequest:
    """Validate a decoded token request against the models this swarm serves; ValueError says what is wrong."""
    if not isinstance(req, dict):
        raise ValueError(f"a token request is a map, got {type(req).__name__}")
    episode_id = S.check_token(str(req.get("episode_id", "")), "episode id")
    raw_agent_models = req.get("agent_models") or {}
    if not isinstance(raw_agent_models, dict):
        raise ValueError(f"agent_models must be a map agent → [model], got {raw_agent_models!r}")
    per_agent = {str(a): _names(ms, f"agent_models[{a!r}]") for a, ms in raw_agent_models.items()}
    models = _names(req.get("models"), "models") or list(
        dict.fromkeys(m for ms in per_agent.values() for m in ms)
    )
    if not models:
        raise ValueError(
            f"token request for episode {episode_id} names no models: send `models` (or `agent_models`) "
            f"with the models the episode may call; this swarm serves {sorted(served)}"
        )
    unknown = [m for m in models if m not in served]
    if unknown:
        raise ValueError(f"unknown models {unknown}; this swarm serves {sorted(served)}")
    agents = _names(req.get("agents"), "agents") or list(per_agent) or ["agent"]
    if len(agents) > MAX_AGENTS or len(per_agent) > MAX_AGENTS:
        raise ValueError(f"token request for episode {episode_id} names over {MAX_AGENTS} agents")
    for agent, ms in per_agent.items():
        if agent not in agents:
            raise ValueError(
                f"agent_models names agent {agent!r}, which is not one of the episode's agents {agents}"
            )
        outside = [m for m in ms if m not in models]
        if outside:
            raise ValueError(
                f"agent_models[{agent!r}] names {outside}, which are not among the episode's models {models}"
            )
    task = req.get("task") or ""
    if not isinstance(task, str):
        raise ValueError(f"task must be the task's name (a string), got {task!r}")
    return TokenRequest(
        episode_id=episode_id,
        models=tuple(models),
        agent_models={a: tuple(per_agent.get(a, models)) for a in agents},
        group_key=str(req.get("group_key") or ""),
        task=task,
        eval=bool(req.get("eval")),
        ttl_s=float(req.get("ttl_s", 3600)),
        client_id=str(req.get("client_id", "")),
        client_version=str(req.get("client_version", "")),
    )
