"""Study files are validated before anything runs, and every error names its entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.research.study import TEMPLATE, StudyError, load_study, load_study_text

ROOT = Path(__file__).resolve().parents[3]
STUDY = """
name = "t"
question = "q?"
seeds = [1, 2]
[baseline]
flags = { task = "calculator", eval-limit = 8 }
[arms.fast]
flags = { lr = 3e-4 }
[budget]
run_minutes = 2
"""


def errors_of(text: str, tmp_path: Path) -> str:
    with pytest.raises(StudyError) as exc:
        load_study_text(text, tmp_path)
    return str(exc.value)


def test_template_and_shipped_studies_are_valid() -> None:
    assert load_study_text(TEMPLATE, ROOT / "studies").arm_names == ["baseline", "high-lr", "kl"]
    for path in (ROOT / "studies").glob("*.toml"):
        study = load_study(path)
        assert len(study.runs()) == len(study.arm_names) * len(study.seeds)


def test_flags_become_up_arguments(tmp_path: Path) -> None:
    study = load_study_text(
        STUDY.replace("lr = 3e-4", 'lr = 3e-4, trainer-arg = ["--kl-coef=0.1"]'), tmp_path
    )
    assert study.flags("fast") == {
        "task": "calculator",
        "eval_limit": 8,
        "lr": 3e-4,
        "trainer_arg": ["--kl-coef=0.1"],
    }
    argv = study.up_argv("fast", 2, tmp_path / "r")
    assert argv == [
        "--task", "calculator", "--eval-limit", "8", "--lr", "0.0003", "--trainer-arg=--kl-coef=0.1",
        "--minutes", "2", "--seed", "2", "--run-dir", str(tmp_path / "r"), "--no-display",
    ]  # fmt: skip
    assert study.runs() == [("baseline", 1), ("fast", 1), ("baseline", 2), ("fast", 2)]


def test_config_paths_are_relative_to_the_study_file(tmp_path: Path) -> None:
    (tmp_path / "swarm.toml").write_text((ROOT / "examples" / "cocktail.toml").read_text())
    text = STUDY.replace('task = "calculator", ', 'config = "swarm.toml", ')
    assert load_study_text(text, tmp_path).flags("fast")["config"] == str(tmp_path / "swarm.toml")
    assert "baseline.flags.config: " in errors_of(text, tmp_path / "elsewhere")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("lr = 3e-4", "lrr = 3e-4"), "arms.fast.flags.lrr: unknown swarmrl up flag"),
        (("lr = 3e-4", "seed = 3"), "arms.fast.flags.seed: set by research (the seed comes from `seeds`)"),
        (("lr = 3e-4", "minutes = 3"), "arms.fast.flags.minutes: set by research"),
        (("lr = 3e-4", 'lr = "fast"'), "arms.fast.flags.lr: expected float, got 'fast'"),
        (("lr = 3e-4", 'actions = "never"'), "arms.fast.flags.actions: must be one of"),
        (("lr = 3e-4", "lr = 0"), "arms.fast: invalid swarm description"),
        (('task = "calculator"', 'task = "nope"'), "baseline: invalid swarm description"),
        (("seeds = [1, 2]", "seeds = [1, 1]"), "seeds: seeds must be distinct"),
        (("run_minutes = 2", "run_minutes = 0"), "budget.run_minutes: Input should be greater than 0"),
        (("[arms.fast]", "[arms.baseline]"), "arms.baseline: an arm name"),
        (("[arms.fast]", "[arms.fast]\nspeed = 1"), "arms.fast.speed: Extra inputs are not permitted"),
        (('name = "t"', 'name = "a b"'), "name: String should match pattern"),
    ],
)
def test_errors_name_the_entry(change: tuple[str, str], message: str, tmp_path: Path) -> None:
    assert message in errors_of(STUDY.replace(*change), tmp_path)


def test_a_baseline_error_is_named_once(tmp_path: Path) -> None:
    errors = errors_of(STUDY.replace('task = "calculator"', 'task = "nope"'), tmp_path)
    assert errors.count("unknown built-in task") == 1


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ('sql = "SELECT nope FROM evals"', 'metric.sql: Binder Error: Referenced column "nope"'),
        ('sql = "SELECT 1; SELECT 2"', "metric.sql: must be one SELECT statement, got 2"),
        ('sql = "DROP TABLE evals"', "metric.sql: must be one SELECT statement"),
        ('sql = "SELECT step, success_rate FROM evals"', "metric.sql: must select 1 column(s), selects 2"),
        ('use = "final_success"\ncurve = "SELECT step FROM evals"', "metric.curve: must select 2 column(s)"),
        ('use = "median"', "metric: Value error, use: unknown metric 'median'"),
        ('use = "final_success"\nsql = "SELECT 1"', "give exactly one of `use`"),
    ],
)
def test_metric_sql_is_checked_on_an_empty_ledger(metric: str, message: str, tmp_path: Path) -> None:
    assert message.replace("Value error, ", "") in errors_of(STUDY + f"[metric]\n{metric}\n", tmp_path)


def test_early_stop_checkpoints_must_leave_seeds(tmp_path: Path) -> None:
    text = STUDY + "[early_stop]\nafter_seeds = [2]\n"
    assert "early_stop.after_seeds [2]: increasing checkpoints between 1 and 1" in errors_of(text, tmp_path)
    assert load_study_text(text.replace("[2]", "[1]"), tmp_path).early_stop is not None


def test_not_toml_and_missing_files(tmp_path: Path) -> None:
    assert "not valid TOML" in errors_of("name = ", tmp_path)
    with pytest.raises(StudyError, match="cannot read study"):
        load_study(tmp_path / "none.toml")
