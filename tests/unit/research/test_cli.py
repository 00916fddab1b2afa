"""`swarmrl research` refuses what it cannot do before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.research.cli import main
from swarmrl.research.study import load_study_text

ROOT = Path(__file__).resolve().parents[3]


def test_a_topic_without_a_planner_points_at_the_template(capsys: pytest.CaptureFixture) -> None:
    assert main(["--topic", "do learning rates matter?"]) == 2
    err = capsys.readouterr().err
    assert "--planner-url URL --planner-model NAME" in err and "swarmrl research --template" in err


def test_the_template_prints_a_valid_study(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["--template"]) == 0
    assert load_study_text(capsys.readouterr().out, ROOT / "studies").name == "my-study"


def test_check(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["--check", str(ROOT / "studies" / "lr-calculator.toml")]) == 0
    assert "3 arms x 2 seeds = 6 runs of 6 min" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "studies" / "lr-calculator.toml").read_text().replace("lr = 3e-4", "lrr = 3e-4"))
    assert main(["--check", str(bad)]) == 2
    assert "arms.lr-3e-4.flags.lrr: unknown swarmrl up flag" in capsys.readouterr().err


def test_shared_nats_needs_a_conf_dir_with_run_accounts(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        main([str(ROOT / "studies" / "lr-calculator.toml"), "--nats", "nats://127.0.0.1:4222"])
    (tmp_path / "accounts.conf").write_text("accounts {}\n")
    with pytest.raises(SystemExit):
        main(
            [
                str(ROOT / "studies" / "lr-calculator.toml"),
                "--nats",
                "nats://h:1",
                "--nats-conf",
                str(tmp_path),
            ]
        )
    assert "does not include runs.conf" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--resume", str(tmp_path), "--nats", "nats://service:s3cret@h:1", "--nats-conf", str(tmp_path)])
    assert "s3cret" not in capsys.readouterr().err
