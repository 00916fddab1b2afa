import json
from pathlib import Path

import pytest

from swarmrl.services.ledger.query import main
from tests.unit.ledger.factories import dead_letter_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return dead_letter_run(tmp_path)


def test_json_and_csv_output(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT service, code, data FROM dead_letters"
    assert main([sql, "--run-dir", str(run_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"service": "merger", "code": "malformed", "data": "wQA="}]
    assert main(["SELECT count(*) AS n FROM episodes", "--run-dir", str(run_dir), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "0"]


def test_table_output(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["SELECT subject, size FROM dead_letters", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "swarm.ep.e1.env" in out and "1 row" in out


def test_errors_are_one_line_and_exit_1(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["SELEC nonsense", "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("swarmrl query: ") and "Traceback" not in err
    assert main(["SELECT 1", "--run-dir", str(run_dir / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_default_run_dir_comes_from_the_environment(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARMRL_RUN_DIR", str(run_dir))
    assert main(["SELECT count(*) AS n FROM dead_letters", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "1"]
