"""The metric SQL of a study, run over a run's ledger in a DuckDB that reaches no file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarmrl.research.study import (
    DEFAULT_CURVE,
    PRESETS,
    MetricError,
    curve,
    metric_value,
    referenced_views,
    run_sql,
)


def write_evals(run_dir: Path, points: list[tuple[int, str, float]]) -> None:
    folder = run_dir / "ledger" / "evals"
    folder.mkdir(parents=True)
    table = pa.table({
        "step": [p[0] for p in points], "task": [p[1] for p in points], "success_rate": [p[2] for p in points],
        "metric": ["success"] * len(points), "model": ["policy"] * len(points),
    })  # fmt: skip
    pq.write_table(table, folder / "part-0-n1.parquet")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    # two tasks, averaged per version: (0, 0.2), (10, 0.6), (20, 0.4)
    write_evals(
        tmp_path,
        [(0, "a", 0.1), (0, "b", 0.3), (10, "a", 0.6), (10, "b", 0.6), (20, "a", 0.4), (20, "b", 0.4)],
    )
    return tmp_path


def test_named_metrics(run_dir: Path) -> None:
    assert metric_value(run_dir, PRESETS["final_success"][1]) == pytest.approx(0.4)
    assert metric_value(run_dir, PRESETS["best_success"][1]) == pytest.approx(0.6)
    # trapezoids: 10 * (0.2 + 0.6) / 2 + 10 * (0.6 + 0.4) / 2 = 9, over a span of 20
    assert metric_value(run_dir, PRESETS["auc_success"][1]) == pytest.approx(0.45)
    points = curve(run_dir, DEFAULT_CURVE)
    assert [step for step, _ in points] == [0, 10, 20]
    assert [value for _, value in points] == pytest.approx([0.2, 0.6, 0.4])  # pytest 9: flat lists only


def test_an_empty_ledger_gives_no_value(tmp_path: Path) -> None:
    assert metric_value(tmp_path, PRESETS["final_success"][1]) is None
    assert metric_value(tmp_path, PRESETS["auc_success"][1]) is None
    assert metric_value(tmp_path, PRESETS["final_reward"][1]) is None


def test_the_sql_reaches_no_file(run_dir: Path) -> None:
    with pytest.raises(MetricError, match="Permission Error"):
        run_sql(run_dir, "SELECT count(*) FROM read_csv('/etc/passwd')")
    with pytest.raises(MetricError, match="one SELECT"):
        run_sql(run_dir, f"COPY (SELECT 1) TO '{run_dir}/leak.csv'")
    assert not (run_dir / "leak.csv").exists()


def test_a_metric_must_be_a_number(run_dir: Path) -> None:
    with pytest.raises(MetricError, match="the metric is not a number: 'a'"):
        metric_value(run_dir, "SELECT task FROM evals")
    assert referenced_views("SELECT * FROM Evals JOIN train_steps USING (step)") == ["train_steps", "evals"]


def test_curve_axes_are_named_after_the_curve_columns() -> None:
    from swarmrl.research.report import curve_labels

    assert curve_labels(DEFAULT_CURVE) == ("model version (trainer step)", "held-out success")
    minutes = "SELECT (ts - min(ts) OVER ()) / 60 AS minutes, success_rate AS success FROM evals"
    assert curve_labels(minutes) == ("minutes", "success")
    assert curve_labels("SELECT nonsense FROM nowhere") == ("x", "y")


def test_curves_on_their_own_clocks_are_averaged_on_a_common_grid() -> None:
    from swarmrl.research.report import GRID_POINTS, aligned

    versions = {1: [(0, 0.2), (10, 0.6)], 2: [(0, 0.4), (10, 0.8), (20, 0.9)]}
    assert aligned(versions) == {0: [0.2, 0.4], 10: [0.6, 0.8], 20: [0.9]}
    minutes = {1: [(0.0, 0.2), (1.1, 0.6), (5.9, 0.8)], 2: [(0.1, 0.4), (2.0, 0.4), (6.2, 1.0)]}
    at = aligned(minutes)
    xs = sorted(at)
    assert len(xs) == GRID_POINTS and xs[0] == pytest.approx(0.1) and xs[-1] == pytest.approx(5.9)
    assert all(len(ys) == 2 for ys in at.values())
    assert at[xs[0]] == pytest.approx([0.2 + 0.4 * 0.1 / 1.1, 0.4])
    assert at[xs[-1]] == pytest.approx([0.8, 0.4 + 0.6 * 3.9 / 4.2])
