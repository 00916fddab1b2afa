"""The progress display's values: the live table and the `--no-display` log line show the same."""

from __future__ import annotations

from types import SimpleNamespace

from swarmrl.progress import Progress
from swarmrl.schemas import EvalResult, encode
from swarmrl.schemas import subjects as S
from tests.unit.ledger.factories import train_step


async def test_log_line_and_table_show_train_steps_and_the_eval_curve() -> None:
    p = Progress("nats://unused", ["policy"], 300, live=False)
    step = train_step(step=12, reward_mean=0.5)  # the values the line must show
    await p._on_msg(SimpleNamespace(subject=S.train_metrics_subject("policy"), data=encode(step)))
    for version, rate in ((0, 0.34), (10, 0.52)):
        result = EvalResult(model="policy", step=version, task="calculator", success_rate=rate, n=256)
        await p._on_msg(SimpleNamespace(subject=S.eval_metrics_subject("policy"), data=encode(result)))
    line = p.line()
    assert "step 12/300" in line and "reward 0.500" in line and "calculator 34%→52% (v10)" in line
    assert [c.header for c in p.table().columns][0] == "step" and p.step == 12


async def test_two_models_show_each_models_step_and_a_roles_own_metric() -> None:
    p = Progress("nats://unused", ["caller", "reporter"], 50, live=False)
    await p._on_msg(
        SimpleNamespace(
            subject=S.train_metrics_subject("caller"), data=encode(train_step(model="caller", step=7))
        )
    )
    await p._on_msg(
        SimpleNamespace(
            subject=S.train_metrics_subject("reporter"), data=encode(train_step(model="reporter", step=3))
        )
    )
    own = EvalResult(
        model="reporter", step=3, task="team_calculator", success_rate=0.5, n=8, metric="reporter_correct"
    )
    await p._on_msg(SimpleNamespace(subject=S.eval_metrics_subject("reporter"), data=encode(own)))
    line = p.line()
    assert "caller step 7/50" in line and "reporter step 3/50" in line
    assert "team_calculator reporter:reporter_correct 50%" in line
    assert p.step == 3 and not p.done()  # neither model is at 50 yet


async def test_the_line_shows_distinct_instances_per_task_from_the_trainer() -> None:
    p = Progress("nats://unused", ["policy"], 300, live=False)
    assert "distinct -" in p.line()
    step = train_step(step=3, extra={"distinct.calculator": 0.97, "distinct.guess_number": 0.25})
    await p._on_msg(SimpleNamespace(subject=S.train_metrics_subject("policy"), data=encode(step)))
    assert "distinct calculator 97% guess_number 25%" in p.line()
