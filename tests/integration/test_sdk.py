"""The client SDK against a real nats-server, with the gateway's token responder running."""

from __future__ import annotations

import asyncio

import nats
import pytest

from swarmrl.agents import SwarmClient, SwarmError, SyncSwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import decode_event
from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.service import GatewayService
from swarmrl.services.gateway.tokens import verify


@pytest.fixture
async def token_service(swarm_nats: NatsServer):
    nc = await nats.connect(swarm_nats.service_url)
    # The token responder only checks model names; no engine is needed to mint tokens.
    models = dict.fromkeys(("policy", "alpha", "beta"))
    service = GatewayService(GatewayConfig(nats=swarm_nats.service_url, port=18080), nc, models=models)  # type: ignore[arg-type]
    await service.start_nats()
    yield service
    await nc.close()


async def episode_events(server: NatsServer, episode_id: str) -> list:
    nc = await nats.connect(server.service_url)
    sub = await nc.jetstream().subscribe(S.episode_filter(episode_id), ordered_consumer=True)
    events = []
    while True:
        try:
            msg = await sub.next_msg(timeout=0.5)
        except nats.errors.TimeoutError:
            break
        events.append(decode_event(msg.data))
    await nc.close()
    return events


async def test_episode_lifecycle_publishes_ordered_events(swarm_nats: NatsServer, token_service) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent, client_id="agent-1", code_version="v42")
    async with swarm.episode(
        "task-1", models=["policy"], agents=["solver", "critic"], heartbeat_s=0.05
    ) as ep:
        claims = verify(token_service.gateway.secret, ep.token("critic"))
        assert (claims.episode_id, claims.agent, claims.models) == (ep.episode_id, "critic", ("policy",))
        assert ep.base_url == token_service.base_url
        await ep.env("step", {"obs": "hi"})
        await asyncio.sleep(0.2)  # let a few heartbeats go out while the episode is open
        await ep.reward(0.25, agent="solver")
    await swarm.close()

    events = await episode_events(swarm_nats, ep.episode_id)
    kinds = [e.kind for e in events]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "heartbeat" in kinds and "reward" in kinds
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.client_version for e in events} == {"v42"} and {e.client_id for e in events} == {"agent-1"}


async def test_exception_inside_episode_publishes_abort(swarm_nats: NatsServer, token_service) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent)
    with pytest.raises(ZeroDivisionError):
        async with swarm.episode("task-2", models=["policy"], heartbeat_s=0) as ep:
            1 / 0  # noqa: B018
    await swarm.close()
    events = await episode_events(swarm_nats, ep.episode_id)
    assert [e.kind for e in events] == ["begin", "abort"]
    assert "ZeroDivisionError" in events[-1].reason


async def test_republished_event_is_deduplicated(swarm_nats: NatsServer, token_service) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent)
    ep = await swarm.episode("task-3", models=["policy"], heartbeat_s=0).begin()
    from swarmrl.schemas import RewardEvent

    ev = RewardEvent(episode_id=ep.episode_id, seq=1, client_id=swarm.client_id, value=1.0)
    await swarm.publish(ev)
    await swarm.publish(ev)  # e.g. a retry after a lost ack
    await swarm.close()
    events = await episode_events(swarm_nats, ep.episode_id)
    assert [e.kind for e in events] == ["begin", "reward"]


async def test_unknown_model_token_request_is_refused(swarm_nats: NatsServer, token_service) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent)
    with pytest.raises(SwarmError, match="unknown models"):
        await swarm.episode("task-4", models=["nope"], heartbeat_s=0).begin()
    await swarm.close()


async def test_each_agent_token_names_only_its_models(swarm_nats: NatsServer, token_service) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent)
    ep = await swarm.episode(
        "task-6",
        agent_models={"caller": ["alpha"], "reporter": ["beta"]},
        task={"name": "team"},
        heartbeat_s=0,
    ).begin()
    secret = token_service.gateway.secret
    assert {a: verify(secret, ep.token(a)).models for a in ("caller", "reporter")} == {
        "caller": ("alpha",),
        "reporter": ("beta",),
    }
    await ep.end()
    await swarm.close()
    (begin, _) = await episode_events(swarm_nats, ep.episode_id)
    assert (begin.models, begin.agents) == (["alpha", "beta"], ["caller", "reporter"])  # the union


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"models": []}, "names no models"),
        (
            {"models": ["alpha"], "agent_models": {"caller": ["beta"]}},
            r"agent_models\['caller'\] names \['beta'\]",
        ),
        ({"agents": ["caller"], "agent_models": {"judge": ["alpha"]}}, "agent 'judge'"),
    ],
)
async def test_bad_model_grants_are_refused(swarm_nats: NatsServer, token_service, kwargs, error) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent)
    with pytest.raises(SwarmError, match=error):
        await swarm.episode("task-7", heartbeat_s=0, **kwargs).begin()
    await swarm.close()


async def test_sync_wrapper_runs_an_episode(swarm_nats: NatsServer, token_service) -> None:
    def agent() -> str:
        with (
            SyncSwarmClient(swarm_nats.agent) as swarm,
            swarm.episode("task-5", models=["policy"], heartbeat_s=0) as ep,
        ):
            ep.reward(1.0)
            return ep.episode_id

    episode_id = await asyncio.to_thread(agent)
    events = await episode_events(swarm_nats, episode_id)
    assert [e.kind for e in events] == ["begin", "reward", "end"]
