"""A dataset task's reward is called once per group (TRL's convention: lists in, a list of floats out)
by the built-in runner and the evaluator, on the real gateway and engine; a raise or a wrong length
fails every episode of that group, a non-finite value that episode only, and the client plays on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmrl.agents.config import TaskConf
from swarmrl.agents.evaluate import evaluate
from swarmrl.agents.runner import run_client
from swarmrl.agents.sdk import SwarmClient
from swarmrl.agents.tasks import TASKS, TaskSpec, register
from swarmrl.agents.tasks.dataset import data_task
from swarmrl.schemas import AbortEvent, BeginEvent, RewardEvent
from tests.conftest import wait_for
from tests.integration.test_dataset_task import episode_events
from tests.support.localstack import Stack

REWARD = """
import asyncio, math

CALLS = []

async def judge(prompts, completions, answer, **kwargs):
    CALLS.append(len(completions))
    await asyncio.sleep(0)
    if answer[0] == 1:
        raise RuntimeError("the judge is down")
    if answer[0] == 2:
        return [0.5]  # one score for the whole group: the wrong length
    return [math.nan if i == 0 and answer[0] == 3 else 0.25 for i in range(len(completions))]
"""


@pytest.fixture
def judged(tmp_path: Path) -> Iterator[TaskSpec]:
    rows = [{"q": f"Say {i}.", "answer": i} for i in range(4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "judge.py").write_text(REWARD)
    conf = TaskConf(data=["rows.jsonl"], eval_data=["rows.jsonl"], prompt="q", reward="judge.py:judge")
    spec = data_task("judged", conf.resolve_paths(tmp_path))
    register(spec)
    yield spec
    TASKS.pop("judged")


def calls(spec: TaskSpec) -> list[int]:
    env = spec.make_env(spec.eval_tasks()[0])
    return env.task.reward_fn.__globals__["CALLS"]  # type: ignore[no-any-return]


@pytest.mark.timeout(400)
async def test_a_reward_is_called_once_per_group_and_fails_only_what_it_must(
    stack: Stack, judged: TaskSpec
) -> None:
    assert calls(judged) == [2]  # the start-up probe: two completions of one row
    calls(judged).clear()
    swarm = await SwarmClient.connect(stack.nats.service_url, client_id="evaluator", code_version="t")
    try:
        held = await evaluate(swarm, "judged", "policy", samples=2, max_tokens=2)
    finally:
        await swarm.close()
    assert sorted(calls(judged)) == [2, 2, 2, 2] and held.episodes == 8  # one call per question
    calls(judged).clear()
    stop = asyncio.Event()
    client = asyncio.create_task(
        run_client(stack.nats.service_url, "judged", "policy", num_repeat=2, concurrency=1, seed=0, stop=stop,
                   max_tokens=2, drain_s=5.0)
    )  # fmt: skip
    await wait_for(lambda: len(calls(judged)) >= 8, timeout=300, what="8 groups")  # two passes over the rows
    stop.set()
    await asyncio.wait_for(client, timeout=30)  # the client never died of its reward
    assert set(calls(judged)) == {2}  # every call scored a whole group of 2
    events = await episode_events(stack)
    begins = {e.episode_id: e for e in events if isinstance(e, BeginEvent) and not e.eval}
    aborts = {e.episode_id: e.reason for e in events if isinstance(e, AbortEvent) and e.episode_id in begins}
    rewarded = {e.episode_id for e in events if isinstance(e, RewardEvent) and e.episode_id in begins}
    groups: dict[str, list[str]] = {}
    for ep, begin in begins.items():
        groups.setdefault(begin.group_key, []).append(ep)
    by_row: dict[int, list[int]] = {}  # row -> per scored group, how many of its 2 episodes aborted
    for eps in groups.values():
        if len(eps) == 2 and all(ep in rewarded or "RewardError" in aborts.get(ep, "") for ep in eps):
            row = int(begins[eps[0]].task_id.rsplit("-", 1)[1])
            by_row.setdefault(row, []).append(sum(ep in aborts for ep in eps))
    assert set(by_row) == {0, 1, 2, 3}, by_row  # every row scored at least once (two passes)
    assert (
        set(by_row[0]) == {0} and set(by_row[1]) == {2} and set(by_row[2]) == {2}
    )  # a raise, a bad length: all
    assert set(by_row[3]) == {1}  # one non-finite value: that episode only
    reasons = list(aborts.values())
    print("abort reasons:", *sorted(set(r.split(": ", 1)[-1] for r in reasons))[:3], sep="\n  ")
    assert any("raised RuntimeError: the judge is down" in r for r in reasons)
    assert any(
        "returned [0.5] for 2 completions: need a list with one float per completion" in r for r in reasons
    )
    assert any("returned nan for completion 0 of 2: need a finite number" in r for r in reasons)
