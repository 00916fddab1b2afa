"""A dataset task on a real stack (NATS, gateway, embedded engine): the built-in runner plays its rows,
the evaluator measures its held-out rows, and a reward function that fails aborts that one episode
with the error as its recorded reason, while the client carries on."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from swarmrl.agents.config import TaskConf
from swarmrl.agents.evaluate import evaluate
from swarmrl.agents.runner import play_episode
from swarmrl.agents.sdk import SwarmClient
from swarmrl.agents.tasks import TASKS, TaskSpec, register
from swarmrl.agents.tasks.dataset import RewardError, data_task
from swarmrl.schemas import AbortEvent, BeginEvent, EndEvent, LlmEvent, RewardEvent, decode_event
from swarmrl.schemas import subjects as S
from tests.support.localstack import Stack

REWARD = """
def picky(prompts, completions, answer, **kwargs):
    if 3 in answer:
        raise KeyError("row with answer 3")
    return [0.5] * len(completions)
"""


async def episode_events(stack: Stack) -> list[Any]:
    """Every event stored in EPISODES, in order."""
    nc = await nats.connect(stack.nats.service_url)
    try:
        js = nc.jetstream()
        count = (await js.stream_info(S.EPISODES_STREAM)).state.messages
        sub = await js.subscribe(f"{S.EPISODE_PREFIX}.>", ordered_consumer=True)
        return [decode_event((await sub.next_msg(timeout=5)).data) for _ in range(count)]
    finally:
        await nc.close()


@pytest.fixture
def says(tmp_path: Path) -> Iterator[TaskSpec]:
    """A dataset task of 8 rows registered as `says` (removed again afterwards)."""
    rows = [{"q": f"Say {i}.", "answer": i} for i in range(8)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "picky.py").write_text(REWARD)
    conf = TaskConf(data=["rows.jsonl"], prompt="q", reward="picky.py:picky", heldout=0.25)
    spec = data_task("says", conf.resolve_paths(tmp_path))
    register(spec)
    yield spec
    TASKS.pop("says")


@pytest.mark.timeout(180)
async def test_a_dataset_task_plays_evaluates_and_records_a_failing_reward(
    stack: Stack, says: TaskSpec
) -> None:
    rows = {r.columns["answer"]: r for r in [*says.eval_tasks(), *itertools.islice(says.train_tasks(0), 6)]}
    assert sorted(rows) == list(range(8))
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="c", code_version="t")
    try:
        out = await play_episode(swarm, says, rows[5], "policy", max_tokens=4, group_key="g", group_size=1)
        assert out.reward == 0.5 and out.task_id == rows[5].task_id
        with pytest.raises(RewardError, match="raised KeyError"):
            await play_episode(swarm, says, rows[3], "policy", max_tokens=4, group_key="g", group_size=1)
        held = await evaluate(swarm, "says", "policy", samples=2, max_tokens=4)
        assert held.episodes == 4  # the 2 held-out rows, twice each (0.5 < success_at 1.0: no success)
    finally:
        await swarm.close()
    stored = await episode_events(stack)
    evals = {e.episode_id for e in stored if isinstance(e, BeginEvent) and e.eval}
    assert len(evals) == 4
    events = [e for e in stored if e.episode_id not in evals]
    rewards = [e.value for e in events if isinstance(e, RewardEvent)]
    (abort,) = [e for e in events if isinstance(e, AbortEvent)]
    assert rewards == [0.5] and sum(isinstance(e, EndEvent) for e in events) == 1
    assert (
        "RewardError" in abort.reason
        and "picky.py:picky" in abort.reason
        and "row with answer 3" in abort.reason
    )


@pytest.fixture
def count_env(tmp_path: Path) -> Iterator[TaskSpec]:
    """The environment of `tests/unit/agents/test_environment.py`, registered as `count`."""
    from swarmrl.agents.tasks.environment import env_task
    from tests.unit.agents.test_environment import ENV

    (tmp_path / "count.py").write_text(ENV)
    spec = env_task("count", TaskConf(env="count.py:Count", max_turns=3).resolve_paths(tmp_path))
    register(spec)
    yield spec
    TASKS.pop("count")


@pytest.mark.timeout(120)
async def test_an_env_task_plays_with_its_tools_on_the_stack(stack: Stack, count_env: TaskSpec) -> None:
    """The environment's tool specs reach the model call (and the ledger's record of it); the
    episode ends by the environment's word or the turn cap, with the environment's reward."""
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="c", code_version="t")
    try:
        (row,) = count_env.eval_tasks()
        out = await play_episode(swarm, count_env, row, "policy", max_tokens=8, group_key="g", group_size=1)
        held = await evaluate(swarm, "count", "policy", samples=2, max_tokens=8)
    finally:
        await swarm.close()
    assert out.reward in (0.0, 1.0) and 1 <= out.turns <= 3 and held.episodes == 2
    calls = [e for e in await episode_events(stack) if isinstance(e, LlmEvent)]
    assert calls and all(c.tools == count_env.make_env(row).tool_specs for c in calls)
    assert calls[0].messages == [{"role": "user", "content": "How many letters are in apple?"}]


@pytest.mark.timeout(120)
async def test_a_team_env_plays_each_role_as_its_own_agent_on_the_stack(stack: Stack, tmp_path: Path) -> None:
    from swarmrl.agents.tasks.environment import env_task
    from tests.unit.agents.test_environment import TEAM

    (tmp_path / "relay.py").write_text(TEAM)
    roles = {"caller": "policy", "reporter": "policy"}
    spec = env_task("relay", TaskConf(env="relay.py:Relay", roles=roles, max_turns=4).resolve_paths(tmp_path))
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="c", code_version="t")
    try:
        (row,) = spec.eval_tasks()
        out = await play_episode(swarm, spec, row, roles, max_tokens=8, group_key="g", group_size=1)
    finally:
        await swarm.close()
    events = await episode_events(stack)
    calls = [e for e in events if isinstance(e, LlmEvent)]
    assert [c.agent for c in calls][:1] == ["caller"] and set(c.agent for c in calls) == {
        "caller",
        "reporter",
    }
    assert all(c.tools for c in calls if c.agent == "reporter") and not any(
        c.tools for c in calls if c.agent == "caller"
    )
    rewards = {e.agent: e.value for e in events if isinstance(e, RewardEvent)}
    assert rewards["caller"] == 1.0 and set(rewards) == {"caller", "reporter"}  # each agent its own
    assert out.turns == len(calls) <= 4
