"""A model served by two engines behind one gateway: episodes spread over both, each episode's calls
stay on one engine, and when an engine dies the calls go on, on the other, with nothing lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swarmrl.agents.sdk import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from tests.support.localstack import generation_stack, llm_events

ASK = {"model": "policy", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 2}


def served(stack) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {name: core.stats()["requests_finished"] for name, core in stack.engines.items()}


@pytest.mark.timeout(180)
async def test_two_engines_share_a_model_and_cover_for_each_other(
    swarm_nats: NatsServer, tiny_model_dir: Path
) -> None:
    async with generation_stack(swarm_nats, tiny_model_dir, pool=2, engine_retry_s=20) as stack:
        pool = stack.gateway.gateway.models["policy"].engine
        assert len(pool.members) == 2
        async with await SwarmClient.connect(
            swarm_nats.service_url, client_id="alice", code_version="t"
        ) as swarm:

            async def play(i: int, calls: int) -> dict[str, int]:
                """One episode of `calls` sequential calls; which engines served them."""
                before = served(stack)
                async with swarm.episode(f"t{i}", models=["policy"], heartbeat_s=0) as ep:
                    llm = ep.openai(max_retries=0)
                    for _ in range(calls):
                        await llm.chat.completions.create(**ASK)
                return {k: v - before[k] for k, v in served(stack).items()}

            # one at a time: every call of an episode is served by one engine, and both engines serve
            used = [await play(i, 3) for i in range(12)]
            assert all(sorted(u.values()) == [0, 3] for u in used), used
            assert all(sum(u[name] for u in used) > 0 for name in stack.engines)

            # now one engine dies while 16 episodes run at once: every call still gets its answer
            tasks = [asyncio.create_task(play(100 + i, 4)) for i in range(16)]
            await asyncio.sleep(0.3)
            stack.engine_servers["policy#1"].stop()
            await asyncio.gather(*tasks)
            assert pool.failovers > 0  # calls that found it gone went to the other engine
            assert any(until > 0 for until in pool.down_until.values())  # it left the pool
            # and the episodes that follow go to the engine still up, at once
            after = [await play(200 + i, 2) for i in range(4)]
            assert all(u["policy#1"] == 0 and u["policy"] == 2 for u in after)

        events = await llm_events(swarm_nats)
        assert len(events) == 12 * 3 + 16 * 4 + 4 * 2  # every call captured once, none lost or doubled
        assert len({e.msg_id for e in events}) == len(events)
