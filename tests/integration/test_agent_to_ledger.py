"""An agent's episode through the whole capture path: SDK + openai SDK → gateway → engine → JetStream →
ledger → DuckDB. The ledger's rows must hold the exact token ids the engine saw and produced."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from swarmrl.agents import SwarmClient
from swarmrl.agents.runner import play_episode
from swarmrl.agents.tasks import get_task
from swarmrl.agents.tasks.guess_number import GuessNumber
from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.query import connect
from swarmrl.services.ledger.service import Ledger
from tests.conftest import wait_for
from tests.support.localstack import generation_stack, llm_events


@pytest.fixture
async def ledger(swarm_nats: NatsServer, tmp_path: Path) -> AsyncIterator[Path]:
    run_dir = tmp_path / "run"
    service = Ledger(
        LedgerConfig(
            nats=swarm_nats.service_url, run_dir=run_dir, flush_interval_s=0.05, poll_interval_s=0.05
        )
    )
    await service.start()
    yield run_dir
    await service.stop()


async def test_sdk_episode_is_queryable_with_token_exact_llm_calls(
    swarm_nats: NatsServer, tiny_model_dir: Path, ledger: Path
) -> None:
    async with generation_stack(swarm_nats, tiny_model_dir) as stack:
        swarm = await SwarmClient.connect(swarm_nats.agent, code_version="agent-v3")
        task = GuessNumber(secret=40, n=64, max_turns=3)
        out = await play_episode(swarm, get_task("guess_number"), task, "policy", max_tokens=6)
        await swarm.close()
        events = await llm_events(stack.nats)

    def rows() -> list[tuple]:
        return (
            connect(ledger)
            .execute(
                "SELECT episode_id, agent, model, seq, prompt_ids, output_ids, output_logprobs, policy_version "
                "FROM llm_calls ORDER BY seq"
            )
            .fetchall()
        )

    def episode_row() -> list[tuple]:
        return (
            connect(ledger)
            .execute("SELECT status, task_id, client_version, n_llm_calls, reward FROM episodes")
            .fetchall()
        )

    await wait_for(
        lambda: len(rows()) == out.turns and episode_row() and episode_row()[0][0] == "ok",
        what="the episode and its llm calls in Parquet",
    )
    assert out.turns == 3 or out.success
    got = rows()
    for ev, row in zip(events, got, strict=True):
        assert row[0] == ev.episode_id and row[1:4] == ("agent", "policy", ev.seq)
        assert list(row[4]) == ev.prompt_ids and list(row[5]) == ev.output_ids
        assert list(row[6]) == pytest.approx(ev.output_logprobs) and row[7] == ev.policy_version
    for prev, nxt in zip(got, got[1:], strict=False):
        assert list(nxt[4])[: len(prev[4]) + len(prev[5])] == list(prev[4]) + list(prev[5])
    status, task_id, version, n_calls, reward = episode_row()[0]
    assert (status, task_id, version, n_calls) == ("ok", task.task_id, "agent-v3", out.turns)
    assert reward == pytest.approx(out.reward)
