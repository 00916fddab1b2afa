"""Per-task reward means in TrainStep.extra (cocktail training), and reading them back from the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmrl.services.ledger.columns import to_arrow
from swarmrl.services.ledger.query import main as query
from swarmrl.services.ledger.store import PartWriter
from swarmrl.services.ledger.tables import metric_row, sample_row
from swarmrl.services.trainer.ready import task_metrics
from tests.unit.ledger.factories import train_step
from tests.unit.trainer.samples import make_sample


def test_reward_mean_and_count_per_named_task() -> None:
    samples = [
        make_sample("e1", 1.0, task="countdown"),
        make_sample("e2", 0.0, task="countdown"),
        make_sample("e3", 0.5, task="gsm8k"),
        make_sample("e4", 9.0),  # no task name: only in the overall reward_mean
    ]
    assert task_metrics(samples) == {
        "reward_mean.countdown": 0.5,
        "samples.countdown": 2.0,
        "reward_mean.gsm8k": 0.5,
        "samples.gsm8k": 1.0,
    }
    assert task_metrics([make_sample("e5", 1.0)]) == {}


def test_swarmrl_query_reads_per_task_reward_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = [make_sample("e1", 1.0, task="countdown"), make_sample("e2", 0.25, task="gsm8k")]
    step = train_step(reward_mean=0.625, extra={"clip_frac": 0.1, **task_metrics(samples)})
    writer = PartWriter(tmp_path, fsync=False)
    writer.prepare()
    writer.write_group({"train_steps": to_arrow("train_steps", [metric_row(step, "METRICS", 1)[1]])})
    writer.write_group(
        {"samples": to_arrow("samples", [sample_row(s, "SAMPLES", i) for i, s in enumerate(samples)])}
    )

    sql = """SELECT step, (extra->>'$."reward_mean.countdown"')::DOUBLE AS countdown,
                    (extra->>'$."reward_mean.gsm8k"')::DOUBLE AS gsm8k,
                    (extra->>'$."samples.gsm8k"')::DOUBLE AS n_gsm8k FROM train_steps"""
    assert query([sql, "--run-dir", str(tmp_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"step": 1, "countdown": 1.0, "gsm8k": 0.25, "n_gsm8k": 1.0}
    ]
    # The samples view carries the task too: the same means straight from the samples.
    sql = "SELECT task, avg(reward) AS reward FROM samples GROUP BY task ORDER BY task"
    assert query([sql, "--run-dir", str(tmp_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"task": "countdown", "reward": 1.0},
        {"task": "gsm8k", "reward": 0.25},
    ]
