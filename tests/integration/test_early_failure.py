"""Mistakes found before the budget burns: `up`'s progress names the most common abort reason, and
says the run must stop once a task's first 20 training episodes all aborted (`up` exits 1 then)."""

from __future__ import annotations

import pytest

from swarmrl.agents.sdk import SwarmClient
from swarmrl.progress import FIRST_EPISODES, Progress
from tests.conftest import wait_for
from tests.support.localstack import Stack


async def abort(swarm: SwarmClient, task: str, n: int, why: str) -> None:
    for i in range(n):
        try:
            async with swarm.episode(f"{task}-{i}", models=["policy"], task={"name": task}):
                raise AttributeError(f"'Env' object has no attribute {why!r} (row {i})")
        except AttributeError:
            pass


@pytest.mark.timeout(120)
async def test_a_task_whose_first_20_episodes_all_abort_stops_the_run_with_the_reason(stack: Stack) -> None:
    progress = Progress(stack.nats.service_url, ["policy"], steps=10, live=False)
    await progress.start()
    swarm = await SwarmClient.connect(stack.nats.agent, client_id="byo", code_version="t")
    try:
        async with swarm.episode("fine-0", models=["policy"], task={"name": "fine"}) as ep:
            await ep.reward(1.0)
        await abort(swarm, "fine", 5, "score")  # one good episode first: this task is not failing
        await abort(swarm, "broken", FIRST_EPISODES - 1, "step")
        await wait_for(lambda: sum(progress.first.get("broken", {}).values()) == FIRST_EPISODES - 1)
        assert progress.failing() is None and "most: AttributeError" in progress.cells()["episodes"]
        await abort(swarm, "broken", 1, "step")
        why = await wait_for(progress.failing, what="the run to fail")
    finally:
        await swarm.close()
        await progress.stop()
    assert why.startswith(f"the first {FIRST_EPISODES} episodes of task 'broken' all aborted unexpectedly")
    assert "the most common reason (20 episodes): AttributeError: 'Env' object has no attribute 'step'" in why
    print("up prints: swarmrl up: stopped (" + why + ")")
    print("console:", progress.line())
