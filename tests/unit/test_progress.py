"""The progress display's values: the live table and the `--no-display` log line show the same."""

from __future__ import annotations

from types import SimpleNamespace

from swarmrl.progress import Progress
from swarmrl.schemas import EvalResult, encode
from swarmrl.schemas import subjects as S
from tests.unit.ledger.factories import train_step


async def test_log_line_and_table_show_train_steps_and_the_eval_curve() -> None:
    p = Progress("nats://unused", "policy", 300, live=False)
    step = train_step(step=12, reward_mean=0.5)  # the values the line must show
    await p._on_msg(SimpleNamespace(subject=S.train_metrics_subject("policy"), data=encode(step)))
    for version, rate in ((0, 0.34), (10, 0.52)):
        result = EvalResult(model="policy", step=version, task="calculator", success_rate=rate, n=256)
        await p._on_msg(SimpleNamespace(subject=S.eval_metrics_subject("policy"), data=encode(result)))
    line = p.line()
    assert "step 12/300" in line and "reward 0.500" in line and "calculator 34%→52% (v10)" in line
    assert [c.header for c in p.table().columns][0] == "step" and p.step == 12
