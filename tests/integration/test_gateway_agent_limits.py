"""Per-agent fairness on the real gateway: an identity past its call rate gets 429 with Retry-After
(others are served meanwhile), and an identity at its concurrent-episode bound waits for a token
until one of its episodes ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest

from swarmrl.agents.sdk import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from tests.conftest import wait_for
from tests.support.localstack import generation_stack


async def agent(server: NatsServer, name: str) -> SwarmClient:
    """A client of identity `name` (closed by `async with`)."""
    return await SwarmClient.connect(server.service_url, client_id=name, code_version="t")


ASK = {"model": "policy", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 2}


@pytest.mark.timeout(120)
async def test_an_agent_past_its_rate_gets_429_with_retry_after_and_others_go_on(
    swarm_nats: NatsServer, tiny_model_dir: Path
) -> None:
    async with generation_stack(swarm_nats, tiny_model_dir, agent_rate=0.5, agent_burst=2) as stack:
        async with await agent(swarm_nats, "alice") as a, await agent(swarm_nats, "bob") as b:
            async with a.episode("t", models=["policy"], heartbeat_s=0) as ep_a:
                url, token = ep_a.base_url + "/chat/completions", ep_a.token()
                async with httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http:
                    first = [(await http.post(url, json=ASK)).status_code for _ in range(2)]
                    refused = await http.post(url, json=ASK)
                assert first == [200, 200]  # the burst
                assert refused.status_code == 429
                assert refused.json()["error"]["code"] == "rate_limit_exceeded"
                wait = float(refused.headers["retry-after-ms"]) / 1000
                assert 0 < wait <= 2.0 and int(refused.headers["retry-after"]) >= wait  # 1 call per 2 s
                async with b.episode("t", models=["policy"], heartbeat_s=0) as ep_b:  # bob has his own bucket
                    reply = await ep_b.openai(max_retries=0).chat.completions.create(**ASK)
                    assert reply.choices[0].message is not None
                # the OpenAI SDK waits out Retry-After by itself and gets through
                started = time.monotonic()
                await ep_a.openai(max_retries=2).chat.completions.create(**ASK)
                assert time.monotonic() - started >= 0.5 * wait
                with pytest.raises(openai.RateLimitError):  # and without retries it sees the 429
                    await ep_a.openai(max_retries=0).chat.completions.create(**ASK)
            assert stack.gateway.limits.refused_calls >= 2


@pytest.mark.timeout(120)
async def test_an_agent_at_its_episode_bound_waits_until_one_ends(
    swarm_nats: NatsServer, tiny_model_dir: Path
) -> None:
    async with generation_stack(swarm_nats, tiny_model_dir, agent_max_episodes=1) as stack:
        second_started = asyncio.Event()

        async def second() -> None:
            async with a.episode("t2", models=["policy"], heartbeat_s=0):
                second_started.set()

        async with await agent(swarm_nats, "alice") as a, await agent(swarm_nats, "bob") as b:
            first = a.episode("t1", models=["policy"], heartbeat_s=0)
            await first.__aenter__()
            waiting = asyncio.create_task(second())
            await asyncio.sleep(2.5)
            assert not second_started.is_set()  # alice's second episode waits for a token
            assert stack.gateway.limits.refused_episodes >= 1
            async with b.episode("t3", models=["policy"], heartbeat_s=0):  # bob is not held by alice's bound
                pass
            await first.__aexit__(None, None, None)  # its end event frees alice's place
            await asyncio.wait_for(second_started.wait(), timeout=10)
            await waiting
            await wait_for(
                lambda: stack.gateway.limits.open_count("alice") == 0, timeout=5, what="slots freed"
            )


@pytest.mark.timeout(120)
async def test_episodes_share_one_connection_pool_that_closing_an_episode_client_leaves_open(
    swarm_nats: NatsServer, tiny_model_dir: Path
) -> None:
    """Each episode's `ep.openai()` rides the swarm client's pool (a fresh one cost ~60 ms of CPU per
    episode); `async with ep.openai()` closing its client must not close it under the next episode."""
    async with generation_stack(swarm_nats, tiny_model_dir):
        swarm = await SwarmClient.connect(swarm_nats.service_url, client_id="alice", code_version="t")
        try:
            pool = swarm.http_client
            for task in ("t1", "t2"):  # the second episode's call would fail on a closed pool
                async with swarm.episode(task, models=["policy"], heartbeat_s=0) as ep:
                    async with ep.openai(max_retries=0) as llm:
                        await llm.chat.completions.create(**ASK)
            assert swarm.http_client is pool and not pool.is_closed
        finally:
            await swarm.close()
        assert pool.is_closed
