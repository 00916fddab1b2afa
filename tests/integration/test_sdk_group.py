"""`SwarmClient.group`: one call plays a whole GRPO group (the README's "Bring your own agent")."""

from __future__ import annotations

import itertools

import pytest

from swarmrl.agents.sdk import Episode, SwarmClient
from swarmrl.schemas import AbortEvent, BeginEvent, EndEvent
from tests.integration.test_dataset_task import episode_events
from tests.support.localstack import Stack


@pytest.mark.timeout(120)
async def test_a_group_is_size_episodes_of_one_declared_group_and_a_failure_aborts_one(stack: Stack) -> None:
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="byo", code_version="t")
    tries = itertools.count()

    async def play(ep: Episode) -> str:
        reply = await ep.openai(max_retries=0).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "2+2?"}], max_tokens=2
        )
        if next(tries) == 1:
            raise RuntimeError("this try failed")
        await ep.reward(1.0)
        return reply.choices[0].message.content or ""

    try:
        results = await swarm.group("sum-1", play, size=3, models=["policy"], task={"name": "byo"})
    finally:
        await swarm.close()
    assert (
        sum(isinstance(r, RuntimeError) for r in results) == 1
        and sum(isinstance(r, str) for r in results) == 2
    )
    events = await episode_events(stack)
    begins = [e for e in events if isinstance(e, BeginEvent)]
    assert (
        len(begins) == 3 and len({b.group_key for b in begins}) == 1 and {b.group_size for b in begins} == {3}
    )
    assert begins[0].group_key.startswith("sum-1@byo-") and {b.task_id for b in begins} == {"sum-1"}
    assert sum(isinstance(e, EndEvent) for e in events) == 2
    (abort,) = [e for e in events if isinstance(e, AbortEvent)]
    assert "this try failed" in abort.reason
