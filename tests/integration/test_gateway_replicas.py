"""Two gateways in one queue group admit as one does, against a real nats-server: the episodes of a
group land on either gateway at once, yet every group is admitted once and whole, both gateways
count one mix, and a gateway started later knows what was admitted before it; an agent's bound on
open episodes holds across both, and a slot its dead client left is freed once idle; its call rate
holds across both too."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from typing import Any

import nats
import pytest

from swarmrl.agents import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.common.kv_watch import live_keys
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.service import GatewayService
from tests.conftest import wait_for

MODEL = "policy"
WEIGHTS = ["calculator=0.7", "guess_number=0.3"]
GROUP = 4


async def start_gateway(server: NatsServer, **config: Any) -> tuple[GatewayService, nats.NATS]:
    nc = await nats.connect(server.url("gateway"))  # the gateway role's own user: KV rights included
    cfg = GatewayConfig(nats=server.url("gateway"), port=0, task_weight=WEIGHTS, mix_slack=1.0, **config)
    # The token responder only checks model names; no engine is needed to mint tokens.
    service = GatewayService(cfg, nc, models={MODEL: None})  # type: ignore[dict-item]
    service.admission.retry_after_s = service.limits.retry_after_s = 0.05
    await service.start_nats()
    return service, nc


async def stop_gateways(started: list[tuple[GatewayService, nats.NATS]]) -> None:
    for service, nc in started:
        await service.admission.groups.stop()
        await service.episodes.stop()
        await service.calls.stop()
        await nc.close()


@pytest.fixture
async def gateways(swarm_nats: NatsServer):
    started = [await start_gateway(swarm_nats) for _ in range(2)]
    yield [service for service, _ in started]
    await stop_gateways(started)


async def play_groups(server: NatsServer, task: str, stop: asyncio.Event, played: Counter[str], workers: int):
    """A task's client: plays groups of GROUP episodes *at once* (their token requests race to both
    gateways) with fresh group keys until `stop`; counts the groups it played whole."""
    swarm = await SwarmClient.connect(server.agent, client_id=f"{task}-client")
    keys = itertools.count()

    async def episode(key: str) -> None:
        async with swarm.episode(key, models=[MODEL], task={"name": task}, heartbeat_s=0):
            pass

    async def worker() -> None:
        while not stop.is_set():
            key = f"{task}-{next(keys)}"
            await asyncio.gather(*(episode(key) for _ in range(GROUP)))
            played[key] += 1

    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        await swarm.close()


async def test_two_gateways_admit_each_group_once_and_mix_as_one(
    swarm_nats: NatsServer, gateways: list[GatewayService]
):
    stop, played = asyncio.Event(), Counter[str]()
    # guess_number is the greedier client (3 workers against 2); the weights still hold.
    clients = [
        asyncio.create_task(play_groups(swarm_nats, "calculator", stop, played, workers=2)),
        asyncio.create_task(play_groups(swarm_nats, "guess_number", stop, played, workers=3)),
    ]

    def progress() -> bool:
        crashed = [c.exception() for c in clients if c.done()]
        assert not crashed, crashed
        return len(played) >= 100

    await wait_for(progress, timeout=90, what="100 groups")
    stop.set()
    for c in clients:  # a client held now would wait for the other task's window: stop it
        c.cancel()
    await asyncio.gather(*clients, return_exceptions=True)

    # both gateways admitted groups (the queue group spread the requests), and both know them all ...
    assert all(g.admission.groups.claimed > 0 for g in gateways)
    assert sum(g.admission.groups.claimed for g in gateways) >= len(played)
    assert all(g.admission.groups.known(key) for g in gateways for key in played)
    # ... each group was admitted by exactly one of them, and both charged every group once:
    per_task = Counter(key.split("-")[0] for key in played)
    await wait_for(
        lambda: all(g.mixer.admitted == gateways[0].mixer.admitted for g in gateways),
        timeout=5, what="both gateways to count the same groups",
    )  # fmt: skip
    counted = gateways[0].mixer.admitted
    for task, n in per_task.items():  # a group in flight at the stop is counted, not yet played
        assert n <= counted[task] <= n + 3
    total = sum(counted.values())
    assert counted["calculator"] / total == pytest.approx(0.7, abs=0.07)
    assert sum(g.admission.held for g in gateways) > 0  # the mix held something back

    # A third gateway, started now, knows those groups and charges them: it admits a late sibling of
    # an admitted group even though that task is now past its share on every gateway.
    late, nc = await start_gateway(swarm_nats)
    try:
        assert late.mixer.admitted == counted
        key = next(k for k in played if k.startswith("guess_number"))
        assert late.admission.groups.known(key)
        assert await late.admission.check([MODEL], key, False, "guess_number") == 0.0
        assert late.admission.groups.claimed == 0  # it admitted nothing itself
    finally:
        await late.admission.groups.stop()
        await nc.close()


async def test_a_gateway_lost_mid_run_leaves_the_other_admitting_every_group_whole(
    swarm_nats: NatsServer, gateways: list[GatewayService]
):
    stop, played = asyncio.Event(), Counter[str]()
    clients = [asyncio.create_task(play_groups(swarm_nats, "calculator", stop, played, workers=3))]
    await wait_for(lambda: len(played) >= 20, timeout=60, what="20 groups")
    await gateways[0].nc.close()  # gone at once: its queue-group share goes to the other
    before = len(played)
    await wait_for(lambda: len(played) >= before + 30, timeout=60, what="30 groups after the loss")
    stop.set()
    for c in clients:
        c.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    survivor = gateways[1].admission.groups
    assert all(survivor.known(key) for key in played)  # every group, admitted by either, is known
    assert survivor.claimed > 0
    assert len(played) <= gateways[1].mixer.admitted["calculator"] <= len(played) + 3


async def test_an_agents_episode_bound_holds_across_gateways_and_an_abandoned_slot_is_freed(
    swarm_nats: NatsServer,
):
    started = [
        await start_gateway(swarm_nats, agent_max_episodes=2, agent_episode_idle_s=1.5) for _ in range(2)
    ]
    gateways = [service for service, _ in started]
    swarm = await SwarmClient.connect(swarm_nats.agent, client_id="alice")
    open_now, most, urls = 0, 0, Counter[str]()

    async def episode(i: int) -> None:
        nonlocal open_now, most
        async with swarm.episode(f"k{i}", models=[MODEL], task={"name": "calculator"}, heartbeat_s=0) as ep:
            open_now += 1
            most = max(most, open_now)
            urls[ep.base_url] += 1  # the gateway that granted it
            await asyncio.sleep(0.1)
            open_now -= 1

    try:
        # 1. Sixteen episodes of one identity at once, their token requests spread over both
        # gateways: never more than two open (each gateway counting its own would allow four).
        await asyncio.wait_for(asyncio.gather(*(episode(i) for i in range(16))), timeout=60)
        assert most == 2 and len(urls) == 2 and sum(urls.values()) == 16
        assert sum(g.limits.refused_episodes for g in gateways) > 0
        await wait_for(
            lambda: all(g.limits.open_count("alice") == 0 for g in gateways), timeout=5, what="ends"
        )
        # 2. Its client dies holding both slots (no end, no call): another episode waits, then gets
        # a slot once the abandoned ones were idle for 1.5 s.
        hung = [
            swarm.episode(f"h{i}", models=[MODEL], task={"name": "calculator"}, heartbeat_s=0)
            for i in range(2)
        ]
        for ep in hung:
            await ep.__aenter__()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(episode(99), timeout=20)
        assert loop.time() - began >= 1.0  # it waited for the idle slots
        assert all(
            g.limits.find("alice", "h0") is None or g.limits.find("alice", "h1") is None for g in gateways
        )
    finally:
        await swarm.close()
        await stop_gateways(started)


async def test_an_agents_call_rate_holds_across_gateways(swarm_nats: NatsServer):
    """One identity calls as fast as it can for 3 s over NATS, where the gateways' queue group spreads
    its calls over both: they serve about burst + rate x 3 s in all, not that much each."""
    rate, burst, seconds = 4.0, 4, 3.0
    started = [
        await start_gateway(swarm_nats, secret="shared", agent_rate=rate, agent_burst=burst) for _ in range(2)
    ]
    swarm = await SwarmClient.connect(swarm_nats.agent, client_id="alice")
    served = refused = 0
    try:
        async with swarm.episode("k", models=[MODEL], task={"name": "calculator"}, heartbeat_s=0) as ep:
            request = {"model": MODEL, "messages": [{"role": "user", "content": "1+1"}]}
            call = json.dumps({"api_key": ep.token(), "request": request}).encode()
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while loop.time() < end:
                reply = json.loads((await swarm.nc.request(S.llm_subject(MODEL), call, timeout=5)).data)
                # No engine here: a call the rate lets through fails next, at the model lookup (404).
                assert reply["status"] in (404, 429), reply
                served += reply["status"] == 404
                refused += reply["status"] == 429
                if reply["status"] == 429:
                    assert 0 < reply["retry_after_s"] <= 1 / rate * (burst + 1)
        assert all(service.limits.refused_calls > 0 for service, _ in started)  # both served calls
        # one gateway's bound is burst + rate x seconds = 16; each counting its own would serve ~32
        assert burst + rate * (seconds - 2) <= served <= burst + rate * seconds + 6, (served, refused)
    finally:
        await swarm.close()
        await stop_gateways(started)


async def test_an_episode_given_a_slot_by_two_gateways_at_once_keeps_one(swarm_nats: NatsServer):
    """Its token requests reach both gateways before either saw the other's slot: each takes one, and
    then the higher is freed, so the identity loses no slot to it (it would stay taken for the
    bucket's hour otherwise)."""
    started = [await start_gateway(swarm_nats, agent_max_episodes=4) for _ in range(2)]
    a, b = (service.episodes for service, _ in started)
    stream = f"KV_{S.GROUPS_BUCKET}"

    async def writes() -> int:
        return (await started[0][0].js.stream_info(stream)).state.last_seq

    async def live_slots() -> list[int]:
        return sorted(int(k.rsplit(".", 1)[1]) for k in await live_keys(a.js, a.kv, "e.>"))

    async def settled() -> bool:
        views = [s.limits.find("alice", "alice_e1") for s in (a, b)]
        return await live_slots() == [0] and all(v is not None and v.slot == 0 for v in views)

    try:
        before = await writes()
        both = await asyncio.gather(a.take("alice", "alice_e1", 0.0), b.take("alice", "alice_e1", 0.0))
        assert both == [0.0, 0.0]  # each granted it a slot
        await wait_for(settled, timeout=5, what="one slot left, seen by both")
        assert await writes() - before == 3  # slots 0 and 1 created, 1 deleted
        await a.give_back("alice", "alice_e1")
        await wait_for(lambda: b.limits.open_count("alice") == 0, timeout=5, what="the slot freed")
        assert await live_slots() == []
    finally:
        await stop_gateways(started)
