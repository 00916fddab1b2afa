"""Token requests (`swarm.auth.token.<client>`): check one and resolve which models each agent may
call: all the episode's, unless `agent_models` narrows them per agent. Pure logic, no NATS; see
schemas/README.md "Episode tokens".
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from swarmrl.schemas import TokenRequest, decode
from swarmrl.schemas import subjects as S

MAX_REQUEST_BYTES = 64 * 1024
"""A token request is a few names; a larger one is refused unread (`oversized`)."""
MAX_AGENTS = 64
"""Agents per episode: the gateway signs one token each, so a request may not ask for thousands."""


@dataclass(frozen=True)
class Grant:
    """A checked token request, each agent's models resolved."""

    request: TokenRequest
    models: tuple[str, ...]
    """The episode's models: `models`, or the union of `agent_models` when that is empty."""
    agent_models: dict[str, tuple[str, ...]]
    """Every agent of the episode (in request order) → the models its token names."""


def check_token_request(data: bytes, served: Collection[str]) -> Grant:
    """Decode a token request and check it against the models served; ValueError says what is wrong."""
    req = decode(data, TokenRequest, max_bytes=MAX_REQUEST_BYTES)
    S.check_token(req.episode_id, "episode id")
    per_agent = {a: list(dict.fromkeys(ms)) for a, ms in req.agent_models.items()}
    models = list(dict.fromkeys(req.models or [m for ms in per_agent.values() for m in ms]))
    if not models:
        raise ValueError(
            f"token request for episode {req.episode_id} names no models: send `models` (or `agent_models`) "
            f"with the models the episode may call; this swarm serves {sorted(served)}"
        )
    unknown = [m for m in models if m not in served]
    if unknown:
        raise ValueError(f"unknown models {unknown}; this swarm serves {sorted(served)}")
    agents = list(dict.fromkeys(req.agents)) or list(per_agent) or ["agent"]
    if len(agents) > MAX_AGENTS or len(per_agent) > MAX_AGENTS:
        raise ValueError(f"token request for episode {req.episode_id} names over {MAX_AGENTS} agents")
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
    return Grant(req, tuple(models), {a: tuple(per_agent.get(a, models)) for a in agents})


def check_task(task: str, owner: str, tasks: Collection[str], own: Collection[str], outside: bool) -> None:
    """Raise ValueError unless identity `owner` may send episodes of `task`: one of `own` is its
    clients' alone; an undeclared one needs `outside`. No `tasks`: nothing checked."""
    if not tasks:
        return
    if task in own and not S.plays_own_task(owner, task):
        raise ValueError(
            f"task {task!r} is played by this swarm's own clients, and an agent's episodes are never "
            f'mixed into it: name your own task (task={{"name": "my-task"}}), or declare it in the '
            f"description as [tasks.my-task] with clients = 0"
        )
    if task not in tasks and not outside:
        open_tasks = sorted(set(tasks) - set(own))
        raise ValueError(
            f"task {task!r} is not declared in this swarm's description, which allows no outside tasks "
            f"([gateway] outside_tasks = false); tasks open to outside agents: {open_tasks or 'none'}"
        )
