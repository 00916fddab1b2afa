"""The evaluator on a real stack: an episode the swarm fails is played again, never scored as the
model's failure."""

from __future__ import annotations

import asyncio
import logging

import pytest
from localstack import Stack

from swarmrl.agents.evaluate import evaluate
from swarmrl.agents.sdk import SwarmClient
from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.server import create_app


async def _down(stack: Stack) -> int:
    """Stop the engine's HTTP server (the gateway answers 502); returns its port."""
    server = stack.engine_servers["policy"]
    await asyncio.to_thread(server.stop)
    return int(server.url.rsplit(":", 1)[1])


@pytest.mark.timeout(180)
async def test_eval_episodes_failed_by_the_engine_are_played_again_or_left_out(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="evaluator", code_version="t")
    kw = {"limit": 2, "samples": 1, "max_tokens": 8}
    try:
        up = await evaluate(swarm, "calculator", "policy", **kw)
        assert up.episodes == 2

        port = await _down(stack)
        with caplog.at_level(logging.WARNING, logger="swarmrl.evaluator"):
            down = await evaluate(swarm, "calculator", "policy", attempts=1, **kw)
        # left out and said so, not two failures that would read as a 0% policy
        assert down.episodes == 0 and down.success == 0.0
        assert "2 of 2 eval episodes left out" in caplog.text

        async def back() -> None:  # the engine restarts while the evaluator waits to try again
            await asyncio.sleep(5.0)  # longer than the gateway's own retries of the engine (~3 s)
            server = BackgroundServer(create_app(stack.engine), port=port).start()
            stack.engine_servers["policy"] = server  # stopped with the stack

        restart = asyncio.create_task(back())
        again = await evaluate(swarm, "calculator", "policy", attempts=4, **kw)
        await restart
        assert again.episodes == 2
    finally:
        await swarm.close()
