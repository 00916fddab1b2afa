"""`swarmrl query`: which run it reads by default, whole cells in the table, and `| head`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swarmrl.core import rundir
from swarmrl.services.ledger.query import main
from tests.unit.ledger.factories import dead_letter_run


@pytest.fixture
def somewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $SWARMRL_HOME, no $SWARMRL_RUN_DIR, and a cwd with no runs/ in it."""
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SWARMRL_RUN_DIR", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "cwd"


COUNT = ["SELECT count(*) AS n FROM dead_letters", "--format", "csv"]


def test_finds_a_run_started_with_run_dir_from_another_directory(
    tmp_path: Path, somewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead_letter_run(rundir.make_run_dir(tmp_path / "experiments" / "run1"))
    assert main(COUNT) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines() == ["n", "1"]


def test_finds_runs_latest_in_the_cwd(somewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead_letter_run(rundir.make_run_dir(None))
    assert main(COUNT) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines() == ["n", "1"]
    assert main(["SELECT 1 AS one"]) == 0
    assert "1 row from runs/latest" in capsys.readouterr().out, "the caption names the run it found"


def test_no_run_found_says_where_it_looked(somewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["SELECT 1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("swarmrl query: no run found") and "latest-run" in err and "--run-dir" in err


def test_long_cells_are_printed_whole_one_line_per_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = dead_letter_run(tmp_path / "run")
    sql = "SELECT 'episode-' || repeat('0123456789', 30) AS id, '[bold]x[/bold]' AS markup, [1, 2] AS l"
    assert main([sql, "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    rows = [line for line in out.splitlines() if "episode-" in line]
    assert len(rows) == 1 and "episode-" + "0123456789" * 30 in rows[0]
    assert "[bold]x[/bold]" in rows[0] and "[1, 2]" in rows[0], "cells are text, not rich markup"
    assert main([sql, "--run-dir", str(run), "--width", "12"]) == 0
    assert "episode-012…" in capsys.readouterr().out, "--width still cuts when asked"


@pytest.mark.parametrize(
    ("fmt", "sql"),
    [
        ("table", "SELECT range AS n, repeat('y', 100) AS s FROM range(3000)"),
        ("csv", "SELECT range AS n FROM range(200000)"),
    ],
)
def test_a_reader_that_stops_early_ends_it_quietly(tmp_path: Path, fmt: str, sql: str) -> None:
    run = dead_letter_run(tmp_path / "run")
    cmd = [sys.executable, "-m", "swarmrl.cli", "query", sql, "--run-dir", str(run), "--format", fmt]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # `| head -1`: one line, then the pipe closes
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
