"""Every group gets an outcome: an outside agent (its own NATS identity) plays groups through the real
gateway, engine, merger and trainer, and learns what became of each, on a subject only it may read;
the ledger's `groups` has them all, and the trainer warns when most of a client's groups are dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from swarmrl.agents.sdk import Episode, SwarmClient, describe
from swarmrl.infra.nats_server import NatsServer
from swarmrl.report import write_report
from swarmrl.schemas import subjects as S
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.query import connect
from swarmrl.services.ledger.service import Ledger
from swarmrl.services.merger.service import Merger
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.ready import WARN_AFTER_GROUPS
from swarmrl.services.trainer.service import Trainer
from tests.conftest import wait_for
from tests.support.localstack import Stack


@pytest.fixture
async def trainer(swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[Trainer]:
    cfg = TrainerConfig(
        nats=swarm_nats.url("trainer"), model="policy", model_path=str(tiny_model_dir),
        run_dir=str(tmp_path / "run"), batch_groups=1, max_tokens_per_micro_batch=256,
    )  # fmt: skip
    service = await Trainer.start(cfg)
    task = asyncio.create_task(service.run())
    yield service
    service.stop()
    await asyncio.wait_for(task, timeout=30)


def player(rewards: list[float]) -> Callable[[Episode], object]:
    it = iter(rewards)

    async def play(ep: Episode) -> float:
        await ep.openai(max_retries=0).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "2+2?"}], max_tokens=2
        )
        reward = next(it)
        await ep.reward(reward)
        return reward

    return play


@pytest.mark.timeout(240)
async def test_an_agent_learns_that_its_equal_reward_groups_are_dropped_and_why(
    swarm_nats: NatsServer,
    stack: Stack,
    start_merger: Callable[..., Merger],
    trainer: Trainer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start_merger()
    ledger = Ledger(LedgerConfig(nats=swarm_nats.service_url, run_dir=tmp_path / "run", flush_interval_s=0.1))
    await ledger.start()
    spy = swarm_nats.mint_agent("spy")  # another identity: must never see the agent's outcomes
    spy_nc = await nats.connect(**spy.nats_options())
    seen_by_spy: list[bytes] = []

    async def spy_cb(msg: Msg) -> None:
        seen_by_spy.append(msg.data)

    await spy_nc.subscribe(f"{S.OUTCOME_PREFIX}.agent.*", cb=spy_cb)
    swarm = await SwarmClient.connect(swarm_nats.agent, client_id="byo", code_version="t")
    caplog.set_level(logging.WARNING, logger="swarmrl.trainer")
    try:
        same = await swarm.group("same", player([1.0, 1.0]), size=2, models=["policy"], task={"name": "mine"})
        outcome = await swarm.outcome(same.group_key, timeout=60)
        assert (outcome.outcome, outcome.reason, outcome.task, outcome.client_id) == (
            "dropped", "zero_adv", "mine", "byo",
        )  # fmt: skip
        assert (
            outcome.reward_std == 0.0 and outcome.episodes == 2 and "rewards were equal" in describe(outcome)
        )
        print("agent sees:", describe(outcome))

        spread = await swarm.group(
            "spread", player([1.0, 0.0]), size=2, models=["policy"], task={"name": "mine"}
        )
        trained = await swarm.outcome(spread.group_key, model="policy", timeout=90)
        assert (trained.outcome, trained.step, trained.reward_std) == ("trained", 1, 0.5)
        print("agent sees:", describe(trained))

        for i in range(WARN_AFTER_GROUPS - 2):  # most of this client's groups are dropped: one warning
            await swarm.outcome(
                (await swarm.group(f"s{i}", player([0.0, 0.0]), size=2, models=["policy"])).group_key
            )
        warnings = [r.getMessage() for r in caplog.records if "dropped untrained" in r.getMessage()]
        assert len(warnings) == 1 and "client 'byo'" in warnings[0] and "zero_adv" in warnings[0], warnings
        print("trainer log:", warnings[0])

        def groups() -> list[tuple]:
            return (
                connect(tmp_path / "run")
                .execute(
                    "SELECT group_key, task, client_id, model, outcome, reason, step FROM groups ORDER BY ts"
                )
                .fetchall()
            )

        rows = await wait_for(lambda: len(groups()) == WARN_AFTER_GROUPS and groups(), what="the groups view")
        assert rows[0] == (same.group_key, "mine", "byo", "policy", "dropped", "zero_adv", 0)
        assert rows[1] == (spread.group_key, "mine", "byo", "policy", "trained", "", 1)
        await asyncio.sleep(0.5)
        assert seen_by_spy == []

        # its own task, its own held-out evaluations: recorded against the serving version, never trained
        evals = await swarm.evaluate(
            "held-1", player([1.0, 0.0, 1.0]), samples=3, models=["policy"], task={"name": "mine"}
        )
        assert sorted(evals) == [0.0, 1.0, 1.0]  # which try got which reward: as they came

        def own_evals() -> list[tuple]:
            return (
                connect(tmp_path / "run")
                .execute("SELECT count(*) FROM episodes WHERE eval AND status = 'ok' AND task = 'mine'")
                .fetchall()
            )

        await wait_for(lambda: own_evals() == [(3,)], what="the eval episodes in the ledger")
        report = write_report(tmp_path / "run").read_text()
        own = [line for line in report.splitlines() if line.startswith("| mine @byo | policy | agent |")]
        assert len(own) == 1 and "| 66.7% | 3 |" in own[0], report
        assert "| byo | mine | 2 | 50% | zero_adv (1) |" in report, report
        print(
            "report.md:",
            *own,
            *[line for line in report.splitlines() if line.startswith("| byo |")],
            sep="\n",
        )
    finally:
        await swarm.close()
        await spy_nc.close()
        await ledger.stop()


@pytest.mark.timeout(60)
async def test_a_group_whose_every_episode_fails_is_dropped_at_once(swarm: SwarmClient) -> None:
    async def fail(ep: Episode) -> None:
        raise RuntimeError("no luck")

    played = await swarm.group("t", fail, size=2, models=["policy"])
    outcome = await swarm.outcome(played.group_key, timeout=5)
    assert (outcome.outcome, outcome.reason) == ("dropped", "failed_episodes") and len(played) == 2
