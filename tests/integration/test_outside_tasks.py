"""An outside agent's episodes are never mixed into a task the swarm's own clients play: against a
real nats-server and gateway, configured as `swarmrl up` configures it, the gateway refuses such an
agent its tokens with a message that says what to do, while the task's own clients, the evaluator
and the agent's own (declared or, where allowed, undeclared) tasks get theirs."""

from __future__ import annotations

import asyncio

import nats
import pytest

from swarmrl.agents import SwarmClient
from swarmrl.agents.sdk import SwarmError
from swarmrl.infra.nats_server import NatsServer
from swarmrl.launch import client_name, client_names
from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.service import GatewayService
from swarmrl.swarm import Swarm, service_config

MODEL = "policy"


def _swarm(tasks: dict, outside_tasks: bool = True) -> Swarm:
    return Swarm.model_validate(
        {"models": {MODEL: {"base": "tiny"}}, "tasks": tasks, "gateway": {"outside_tasks": outside_tasks}}
    )


MIXED = {"calculator": {"clients": 2}, "mine": {"clients": 0, "weight": 0.5}}
"""Two tasks mixed by weight: the swarm's calculator, and `mine`, declared for an outside agent."""


@pytest.fixture
async def start_gateway(swarm_nats: NatsServer):
    """Start a gateway configured by `service_config` from a description, as `up` starts it."""
    nc = await nats.connect(swarm_nats.service_url)

    async def start(swarm: Swarm) -> GatewayService:
        cfg = service_config(swarm, "gateway", nats=swarm_nats.service_url, port=0)
        # The token responder checks names only; no engine is needed to mint tokens.
        service = GatewayService(cfg, nc, models={MODEL: None})  # type: ignore[dict-item]
        await service.start_nats()
        return service

    yield start
    await nc.close()


async def _begin(swarm: SwarmClient, task: str, *, eval: bool = False):
    ep = swarm.episode("q", models=[MODEL], task={"name": task}, eval=eval, heartbeat_s=0)
    return await asyncio.wait_for(ep.begin(), 10)


async def test_a_builtin_task_is_its_own_clients_alone(swarm_nats: NatsServer, start_gateway):
    await start_gateway(_swarm(MIXED))
    outside = await SwarmClient.connect(swarm_nats.agent, code_version="t")
    for eval in (False, True):  # neither its training nor its evaluation episodes
        with pytest.raises(SwarmError, match="played by this swarm's own clients.*name your own task"):
            await _begin(outside, "calculator", eval=eval)
    ep = await _begin(outside, "mine")  # declared for outside agents (clients = 0)
    assert ep.tokens
    await ep.end()
    with pytest.raises(SwarmError, match=r"mixes tasks by weight.*\[tasks.<name>\] clients = 0"):
        await _begin(outside, "sums")  # several tasks in a mix: an outside task is declared
    await outside.close()

    # The identities `up` mints for calculator's clients (also after a restart) and the evaluator.
    swarm = _swarm(MIXED)
    names = [client_name(p) for g in (0, 3) for p in client_names(swarm, "calculator", g)]
    assert names == ["calculator-0", "calculator-1", "calculator-0-g3", "calculator-1-g3"]
    assert all(S.plays_own_task(n, "calculator") for n in names)
    assert not any(S.plays_own_task(n, "calculator") for n in ("calculator-x", "calculator-0-1", "outside"))
    for name in (names[0], names[3], S.EVALUATOR):
        own = await SwarmClient.connect(swarm_nats.mint_agent(name), code_version="t")
        ep = await _begin(own, "calculator")
        assert ep.tokens, name
        await ep.end()
        await own.close()


@pytest.mark.parametrize("allowed", [True, False])
async def test_an_undeclared_task_where_the_description_allows_it(
    swarm_nats: NatsServer, start_gateway, allowed: bool
):
    await start_gateway(_swarm({"calculator": {"clients": 2}}, outside_tasks=allowed))
    outside = await SwarmClient.connect(swarm_nats.agent, code_version="t")
    if allowed:
        ep = await _begin(outside, "sums")  # named on begin: reported under its own name
        assert ep.tokens
        await ep.end()
    else:
        with pytest.raises(SwarmError, match=r"not declared.*outside_tasks = false.*outside agents: none"):
            await _begin(outside, "sums")
    await outside.close()
