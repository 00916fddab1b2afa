"""Run directories, the latest-run pointers (swarmrl/core/rundir.py) and `swarmrl down` (swarmrl/clients.py), through the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmrl import cli
from swarmrl.core import rundir


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $SWARMRL_HOME, and a cwd with no runs/ in it."""
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "home"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing in for `swarmrl up`."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _elsewhere(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    other = tmp_path / name
    other.mkdir()
    monkeypatch.chdir(other)
    return other


def test_default_run_dir_is_linked_as_runs_latest_and_recorded(home: Path) -> None:
    run = rundir.make_run_dir(None)
    assert run.parent == Path("runs") and run.is_dir()
    assert Path("runs/latest").is_symlink() and Path("runs/latest").resolve() == run.resolve()
    assert (home / "latest-run").read_text().strip() == str(run.resolve())
    assert rundir.latest_run_dir() == Path("runs/latest")


def test_a_run_dir_elsewhere_is_the_latest_run_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = rundir.make_run_dir(tmp_path / "exp" / "r1")
    assert not (tmp_path / "exp" / "latest").exists(), "no stray `latest` beside --run-dir"
    assert not Path("runs").exists(), "nothing created in the cwd for a --run-dir elsewhere"
    _elsewhere(tmp_path, "other", monkeypatch)
    assert rundir.latest_run_dir() == run.resolve()


def test_runs_latest_in_the_cwd_wins_and_follows_a_run_dir_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = rundir.make_run_dir(None).resolve()
    assert rundir.latest_run_dir() == Path("runs/latest")
    second = rundir.make_run_dir(tmp_path / "exp" / "r2")
    assert Path("runs/latest").resolve() == second.resolve(), "an existing runs/latest is repointed"
    # another project's runs/latest is that project's latest, whatever ran last elsewhere
    project = _elsewhere(tmp_path, "project", monkeypatch)
    (project / "runs").mkdir()
    (project / "runs" / "latest").symlink_to(first)
    assert rundir.latest_run_dir() == Path("runs/latest")
    assert Path("runs/latest").resolve() == first


def test_a_runs_latest_that_is_not_a_symlink_is_left_alone() -> None:
    Path("runs/latest").mkdir(parents=True)
    (Path("runs/latest") / "keep").write_text("mine")
    rundir.make_run_dir(None)
    assert (Path("runs/latest") / "keep").read_text() == "mine"


def test_a_recorded_run_that_was_deleted_is_not_the_latest(tmp_path: Path) -> None:
    run = rundir.make_run_dir(tmp_path / "gone")
    run.rmdir()
    assert rundir.latest_run_dir() is None


def test_down_help_prints_usage_and_signals_nothing(
    tmp_path: Path, child: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    rundir.write_pid(rundir.make_run_dir(tmp_path / "run"), child.pid)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["down", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: swarmrl down")
    assert child.poll() is None, "--help must not stop the swarm"


def test_down_stops_the_latest_run_from_another_directory(
    tmp_path: Path, child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = rundir.make_run_dir(tmp_path / "exp" / "run")
    pid_file = rundir.write_pid(run, child.pid)
    _elsewhere(tmp_path, "somewhere", monkeypatch)
    assert cli.main(["down"]) == 0
    assert child.wait(timeout=30) == -signal.SIGTERM
    assert pid_file.exists(), "the pid file is up's to clear, when it has stopped"


def test_down_run_dir_names_the_swarm(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    run = tmp_path / "not-latest"
    run.mkdir()
    rundir.write_pid(run, child.pid)
    rundir.make_run_dir(tmp_path / "another")
    assert cli.main(["down"]) == 1, "the latest run has no swarm"
    assert child.poll() is None
    assert cli.main(["down", "--run-dir", str(run)]) == 0
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_down_finds_the_pid_file_older_versions_of_up_wrote(child: subprocess.Popen[bytes]) -> None:
    Path("runs").mkdir()
    Path("runs/.up.pid").write_text(str(child.pid))
    assert cli.main(["down"]) == 0
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_a_stale_pid_file_is_removed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    pid_file = rundir.write_pid(rundir.make_run_dir(tmp_path / "run"), done.pid)
    assert cli.main(["down"]) == 1
    err = capsys.readouterr().err
    assert f"process {done.pid} is gone" in err and "no running swarm found" in err
    assert not pid_file.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc for process start times")
def test_a_pid_now_used_by_another_process_is_not_signalled(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    pid_file = rundir.make_run_dir(tmp_path / "run") / rundir.PID_NAME
    pid_file.write_text(f"{child.pid} 1\n")  # the recorded up started at tick 1: not this process
    assert cli.main(["down"]) == 1
    assert child.poll() is None
    assert not pid_file.exists()


def test_clear_pid_removes_only_this_process_pid_file(tmp_path: Path) -> None:
    run = rundir.make_run_dir(tmp_path / "run")
    rundir.write_pid(run)
    assert rundir.pid_file(run).read_text().split()[0] == str(os.getpid())
    rundir.clear_pid(run)
    assert not rundir.pid_file(run).exists()
    rundir.write_pid(run, os.getpid() + 1)
    rundir.clear_pid(run)
    assert rundir.pid_file(run).exists(), "another up's pid file stays"
    rundir.clear_pid(tmp_path / "no-such-run")  # nothing to clear: no error


def test_no_swarm_found(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["down"]) == 1
    assert "no running swarm found" in capsys.readouterr().err


def test_help_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in [*cli.VERBS, "serve"]:
        assert f"\nswarmrl {verb} " in out, verb
    assert (
        "swarmrl clients restart TASK   replace a task's client processes in a running swarm "
        "(live code iteration)" in out
    )
    assert cli.VERBS["down"] == ("swarmrl.clients", "down")
    assert cli.VERBS["clients"] == ("swarmrl.clients", "main")
    assert cli.VERBS["status"] == ("swarmrl.clients", "status")
