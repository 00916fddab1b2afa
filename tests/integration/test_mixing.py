"""Task mixing at the gateway against a real nats-server: clients of different tasks, which know
nothing of each other, get new groups admitted in the proportions of `--task-weight`."""

from __future__ import annotations

import asyncio
import itertools

import nats
import pytest

from swarmrl.agents import SwarmClient, SwarmError
from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.service import GatewayService
from tests.conftest import wait_for

MODEL = "policy"
WEIGHTS = ["calculator=0.7", "guess_number=0.3"]


@pytest.fixture
async def gateway(swarm_nats: NatsServer):
    nc = await nats.connect(swarm_nats.service_url)
    cfg = GatewayConfig(nats=swarm_nats.service_url, port=18082, task_weight=WEIGHTS, mix_slack=1.0)
    # The token responder only checks model names; no engine is needed to mint tokens.
    service = GatewayService(cfg, nc, models={MODEL: None})  # type: ignore[dict-item]
    service.admission.retry_after_s = 0.05
    await service.start_nats()
    yield service
    await service.admission.groups.stop()
    await nc.close()


async def task_client(server: NatsServer, task: str, stop: asyncio.Event, done: list[str], *, workers: int):
    """One client process of one task: plays groups of 2 episodes with fresh group keys until `stop`."""
    swarm = await SwarmClient.connect(server.agent, client_id=f"{task}-client")
    keys = itertools.count()

    async def worker() -> None:
        while not stop.is_set():
            key = f"{task}-{swarm.client_id}-{next(keys)}"
            for _ in range(2):  # the group's second episode is never held: its group is admitted
                async with swarm.episode(key, models=[MODEL], task={"name": task}, heartbeat_s=0):
                    pass
            done.append(task)

    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        await swarm.close()


async def test_separate_task_clients_follow_the_weights(swarm_nats: NatsServer, gateway: GatewayService):
    stop, done = asyncio.Event(), []
    # guess_number's client is the greedier one (3 workers against 1); the weights still hold.
    clients = [
        asyncio.create_task(task_client(swarm_nats, "calculator", stop, done, workers=1)),
        asyncio.create_task(task_client(swarm_nats, "guess_number", stop, done, workers=3)),
    ]

    def progress() -> bool:
        crashed = [c.exception() for c in clients if c.done()]
        assert not crashed, crashed
        return len(done) >= 120

    await wait_for(progress, timeout=60, what="120 groups")
    stop.set()
    # A client held at that moment would wait for the other task's window to pass: stop it now.
    for c in clients:
        c.cancel()
    await asyncio.wait(clients, timeout=20)
    mixer = gateway.admission.mixer
    assert mixer is not None
    assert done.count("calculator") / len(done) == pytest.approx(0.7, abs=0.05)
    assert mixer.admitted["calculator"] / sum(mixer.admitted.values()) == pytest.approx(0.7, abs=0.05)
    assert mixer.held["guess_number"] > 0


async def test_unknown_tasks_are_refused_and_eval_and_admitted_groups_never_wait(
    swarm_nats: NatsServer, gateway: GatewayService
):
    swarm = await SwarmClient.connect(swarm_nats.agent)
    with pytest.raises(SwarmError, match=r"'chess'.*\['calculator', 'guess_number'\]"):
        await swarm.episode("t", models=[MODEL], task={"name": "chess"}, heartbeat_s=0).begin()
    with pytest.raises(SwarmError, match="names no task"):
        await swarm.episode("t", models=[MODEL], heartbeat_s=0).begin()

    def ep(key: str, task: str, **kw):
        return swarm.episode(key, models=[MODEL], task={"name": task}, heartbeat_s=0, **kw).begin()

    # guess_number is active with one group; calculator runs ahead until it is held.
    opened = [await asyncio.wait_for(ep("g0", "guess_number"), 5)]
    # calculator joins charged at its share of guess_number's one group (7/3), then gets groups
    # while charged <= 0.7 * all charged + slack (1): 4 get in.
    for i in range(4):
        opened.append(await asyncio.wait_for(ep(f"c{i}", "calculator"), 5))
    held = asyncio.create_task(ep("c-held", "calculator"))
    await asyncio.sleep(0.3)
    assert not held.done(), "a task ahead of its share was admitted"
    # The admitted group's next episode and an eval episode (of any task) get in at once.
    opened.append(await asyncio.wait_for(ep("c0", "calculator"), 5))
    opened.append(await asyncio.wait_for(ep("e", "chess", eval=True), 5))
    # guess_number catches up (two more groups): calculator's held group gets its tokens.
    for i in (1, 2):
        opened.append(await asyncio.wait_for(ep(f"g{i}", "guess_number"), 5))
    opened.append(await asyncio.wait_for(held, 5))
    for e in opened:
        await e.end()
    await swarm.close()


async def test_a_task_whose_clients_are_gone_does_not_block_the_others(
    swarm_nats: NatsServer, gateway: GatewayService
):
    mixer = gateway.admission.mixer
    assert mixer is not None
    mixer.window_s = 0.5
    swarm = await SwarmClient.connect(swarm_nats.agent)
    gone = await swarm.episode("g", models=[MODEL], task={"name": "guess_number"}, heartbeat_s=0).begin()
    await gone.end()  # guess_number's only client leaves after one group

    async def calculator_groups(n: int) -> None:
        for i in range(n):
            async with swarm.episode(f"c{i}", models=[MODEL], task={"name": "calculator"}, heartbeat_s=0):
                pass

    await asyncio.wait_for(calculator_groups(30), 10)
    assert mixer.held["calculator"] > 0  # it did wait, for about the window, then ran alone
    assert mixer.admitted == {"calculator": 30, "guess_number": 1}
    await swarm.close()
