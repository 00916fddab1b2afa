"""The run report of a two-model team run and a cocktail: a curve and a row per model, each role's
own eval metric, per-task train rewards."""

from __future__ import annotations

import json
from pathlib import Path

from swarmrl.report import task_rewards, write_report
from swarmrl.schemas import EvalResult
from swarmrl.services.ledger.columns import to_arrow
from swarmrl.services.ledger.query import connect
from swarmrl.services.ledger.store import PartWriter
from swarmrl.services.ledger.tables import metric_row
from tests.unit.ledger.factories import train_step


def _write(run_dir: Path, records: list) -> None:
    writer = PartWriter(run_dir, fsync=False)
    writer.prepare()
    rows: dict[str, list] = {}
    for seq, record in enumerate(records, start=1):
        table, row = metric_row(record, "METRICS", seq)
        rows.setdefault(table, []).append(row)
    writer.write_group({table: to_arrow(table, r) for table, r in rows.items()})


def test_team_report_has_a_curve_per_model_and_each_roles_own_metric(tmp_path: Path) -> None:
    records = []
    for model in ("caller", "reporter"):
        records += [train_step(model=model, step=s, reward_mean=0.1 * s) for s in (1, 2)]
    for version, (team, own_c, own_r) in enumerate([(0.25, 0.57, 0.45), (0.5, 0.8, 0.7)]):
        step = 10 * version
        common = {"task": "team_calculator", "step": step, "n": 64, "temperature": 1.0}
        records += [
            EvalResult(model="caller", success_rate=team, **common),
            EvalResult(model="caller", success_rate=own_c, metric="caller_valid", **common),
            EvalResult(model="reporter", success_rate=own_r, metric="reporter_correct", **common),
        ]
    _write(tmp_path, records)
    report = write_report(tmp_path, reason="test").read_text()
    assert "trainer steps: caller 2, reporter 2" in report
    assert "eval `team_calculator`: 25.0% (v0) → 50.0% (v10," in report
    assert "eval `team_calculator: caller caller_valid`: 57.0% (v0) → 80.0% (v10," in report
    assert "eval `team_calculator: reporter reporter_correct`: 45.0% (v0) → 70.0% (v10," in report
    assert "| reporter | 2 | 0.200 |" in report
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_cocktail_train_steps_give_a_reward_per_task(tmp_path: Path) -> None:
    extra = {"reward_mean.calculator": 0.75, "reward_mean.guess_number": 0.25, "samples.calculator": 24.0}
    _write(tmp_path, [train_step(step=3, extra=extra)])
    assert sorted(task_rewards(connect(tmp_path))) == [
        ("policy calculator", 3, 0.75),
        ("policy guess_number", 3, 0.25),
    ]
    assert (
        json.loads(connect(tmp_path).execute("SELECT extra FROM train_steps").fetchone()[0])[
            "samples.calculator"
        ]
        == 24
    )


def test_report_states_what_prefix_sharing_saved(tmp_path: Path) -> None:
    steps = [
        train_step(step=s, tokens=tokens, extra={"computed_tokens": float(computed)})
        for s, tokens, computed in ((1, 7000, 500), (2, 8000, 1000))
    ]
    _write(tmp_path, steps)
    report = write_report(tmp_path, reason="test").read_text()
    assert "prefix sharing: the trainer computed 1500 tokens for 15000 sample tokens (10.00x fewer)" in report


def test_report_shows_distinct_training_instances_per_window(tmp_path: Path) -> None:
    """First window: 16 episodes on 16 instances; second: 16 episodes replaying 2 of them."""
    from swarmrl.report import DISTINCT_WINDOW_S
    from swarmrl.schemas import BeginEvent
    from swarmrl.services.ledger.tables import event_row

    t0 = 1_700_000_000.0
    rows: dict[str, list] = {}
    for i in range(32):
        begin = BeginEvent(
            episode_id=f"c_{i}", seq=0, client_id="c", task_id=f"calculator/{i if i < 16 else i % 2}",
            task={"name": "calculator"}, models=["policy"], ts=t0 + (0 if i < 16 else DISTINCT_WINDOW_S) + i,
        )  # fmt: skip
        table, row = event_row(begin, "EPISODES", i + 1)
        rows.setdefault(table, []).append(row)
    writer = PartWriter(tmp_path, fsync=False)
    writer.prepare()
    writer.write_group({table: to_arrow(table, r) for table, r in rows.items()})
    report = write_report(tmp_path).read_text()
    assert "## Training distribution" in report, report
    assert "| calculator | 0-3 | 16 | 16 | 1.000 |" in report
    assert "| calculator | 3-6 | 16 | 2 | 0.125 **narrow** |" in report
