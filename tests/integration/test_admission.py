"""Gateway admission control against a real nats-server: new groups wait while the trainer's
sample backlog is over the bound; admitted groups and eval episodes never wait."""

from __future__ import annotations

import asyncio

import nats
import pytest

from swarmrl.agents import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.service import GatewayService

MODEL = "policy"


@pytest.fixture
async def gateway(swarm_nats: NatsServer):
    nc = await nats.connect(swarm_nats.service_url)
    cfg = GatewayConfig(nats=swarm_nats.service_url, port=18081, max_backlog=3)
    # The token responder only checks model names; no engine is needed to mint tokens.
    service = GatewayService(cfg, nc, models={MODEL: None})  # type: ignore[dict-item]
    service.admission.refresh_s = 0.0  # read the backlog on every request
    service.admission.retry_after_s = 0.1
    await service.start_nats()
    yield service
    await nc.close()


async def _trainer_backlog(server: NatsServer, n: int):
    """Create the trainer's durable consumer and queue `n` samples for it."""
    nc = await nats.connect(server.service_url)
    js = nc.jetstream()
    sub = await bus.durable_pull(
        js, S.SAMPLES_STREAM, S.durable_name("trainer", S.SAMPLES_STREAM, MODEL), S.samples_subject(MODEL)
    )
    for i in range(n):
        await js.publish(S.samples_subject(MODEL), b"x", headers={"Nats-Msg-Id": f"s{i}"})
    return nc, sub


async def test_new_groups_wait_while_the_trainer_is_behind(swarm_nats: NatsServer, gateway: GatewayService):
    swarm = await SwarmClient.connect(swarm_nats.agent, client_id="c", code_version="v")
    # Under the bound: admitted at once, and the group is remembered.
    first = await asyncio.wait_for(
        swarm.episode("t", models=[MODEL], group_key="g1", heartbeat_s=0).begin(), 5
    )
    nc, sub = await _trainer_backlog(swarm_nats, 3)

    # Over the bound: a new group waits; the admitted group and eval episodes do not.
    held = asyncio.create_task(swarm.episode("t", models=[MODEL], group_key="g2", heartbeat_s=0).begin())
    same_group = await asyncio.wait_for(
        swarm.episode("t", models=[MODEL], group_key="g1", heartbeat_s=0).begin(), 5
    )
    ev = await asyncio.wait_for(
        swarm.episode("t", models=[MODEL], group_key="e", eval=True, heartbeat_s=0).begin(), 5
    )
    await asyncio.sleep(0.5)
    assert not held.done(), "a new group was admitted over the backlog bound"
    assert gateway.admission.held >= 2

    # The trainer catches up (acks two samples: backlog 1 < 3): the held group gets its tokens.
    for msg in await sub.fetch(2, timeout=5):
        await msg.ack()
    second = await asyncio.wait_for(held, 5)
    assert second.tokens and same_group.tokens and ev.tokens and first.tokens
    for ep in (first, second, same_group, ev):
        await ep.end()
    await nc.close()
    await swarm.close()


async def test_admission_off_and_no_trainer_never_hold(swarm_nats: NatsServer, gateway: GatewayService):
    swarm = await SwarmClient.connect(swarm_nats.agent, client_id="c", code_version="v")
    # No trainer consumer yet: nothing waits on it.
    ep = await asyncio.wait_for(swarm.episode("t", models=[MODEL], group_key="a", heartbeat_s=0).begin(), 5)
    nc, _ = await _trainer_backlog(swarm_nats, 10)
    gateway.admission.max_backlog = 0  # off
    ep2 = await asyncio.wait_for(swarm.episode("t", models=[MODEL], group_key="b", heartbeat_s=0).begin(), 5)
    assert gateway.admission.held == 0
    for e in (ep, ep2):
        await e.end()
    await nc.close()
    await swarm.close()
