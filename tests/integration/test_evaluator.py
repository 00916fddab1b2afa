"""An engine restart on a real stack: the gateway rides it out, and an eval episode the swarm still
fails is played again, never scored as the model's failure."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from swarmrl.agents.evaluate import evaluate
from swarmrl.agents.sdk import SwarmClient
from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.server import create_app
from tests.support.localstack import Stack, llm_events


async def _down(stack: Stack) -> int:
    """Stop the engine's HTTP server (the gateway cannot reach it); returns its port."""
    server = stack.engine_servers["policy"]
    await asyncio.to_thread(server.stop)
    return int(server.url.rsplit(":", 1)[1])


async def _back(stack: Stack, port: int, after_s: float) -> None:
    """The engine restarts on its port `after_s` seconds later."""
    await asyncio.sleep(after_s)
    server = await asyncio.to_thread(lambda: BackgroundServer(create_app(stack.engine), port=port).start())
    stack.engine_servers["policy"] = server  # stopped with the stack


@pytest.mark.timeout(120)
async def test_a_completion_waits_out_an_engine_restart(stack: Stack) -> None:
    """Before, the gateway gave up on an unreachable engine after ~3 s and every episode in flight
    failed with a 502 (409 of them per engine kill in `just chaos`); an engine restarts in ~30 s."""
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="c", code_version="t")
    try:
        async with swarm.episode("restart", models=["policy"], heartbeat_s=0) as ep:
            llm = ep.openai(max_retries=0)
            port = await _down(stack)
            restart = asyncio.create_task(_back(stack, port, after_s=6.0))
            reply = await llm.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "2+2?"}], max_tokens=4
            )
            await restart
            assert reply.choices[0].message is not None
    finally:
        await swarm.close()


@pytest.mark.timeout(180)
async def test_eval_episodes_failed_by_the_engine_are_played_again_or_left_out(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="evaluator", code_version="t")
    kw = {"limit": 2, "samples": 1, "max_tokens": 8}
    for handle in stack.gateway.gateway.models.values():  # a gateway that gives up on the engine after 1 s
        handle.engine.retry_s = handle.engine.first.retry_s = 1.0
    try:
        up = await evaluate(swarm, "calculator", "policy", **kw)
        assert up.episodes == 2

        port = await _down(stack)
        with caplog.at_level(logging.WARNING, logger="swarmrl.evaluator"):
            down = await evaluate(swarm, "calculator", "policy", attempts=1, **kw)
        # left out and said so, not two failures that would read as a 0% policy
        assert down.episodes == 0 and down.success == 0.0
        assert "2 of 2 eval episodes left out" in caplog.text

        # the engine restarts while the evaluator waits to try again (the gateway gave up)
        restart = asyncio.create_task(_back(stack, port, after_s=5.0))
        again = await evaluate(swarm, "calculator", "policy", attempts=4, **kw)
        await restart
        assert again.episodes == 2
    finally:
        await swarm.close()


@pytest.mark.timeout(180)
async def test_an_evaluation_draws_the_same_tokens_each_time_unless_unseeded(stack: Stack) -> None:
    """Seeded per episode (and per call), an evaluation of the same weights samples the same replies
    however its 16 concurrent episodes interleave in the engine's batches; another seed or the
    engine's own sampler draws others."""
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="evaluator", code_version="t")
    kw = {"limit": 4, "samples": 4, "max_tokens": 8}
    seen = 0

    async def replies(**extra: object) -> Counter[tuple[int, ...]]:
        nonlocal seen
        await evaluate(swarm, "calculator", "policy", **kw, **extra)  # type: ignore[arg-type]
        events = await llm_events(stack.nats)
        new, seen = events[seen:], len(events)
        assert len(new) >= 16
        return Counter(tuple(ev.prompt_ids + [-1] + ev.output_ids) for ev in new)

    try:
        first = await replies()
        assert await replies() == first  # seed 0, the default: the same draws
        assert await replies(seed=1) != first
        assert await replies(seed=None) != first
    finally:
        await swarm.close()
