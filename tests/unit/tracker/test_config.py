"""`--track` / `[tracker] track`: which trackers, refused with the reason before anything starts,
and the tracker process `up` plans only when one is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.core.config import SwarmConfigError
from swarmrl.launch import plan_services
from swarmrl.services.tracker import config as tracker_config
from swarmrl.services.tracker.config import TrackerConfig, check_installed, check_names
from swarmrl.swarm import build
from swarmrl.up import parse_args


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tracker counts as installed (modules any Python has), so these tests run without the extra."""
    for name in tracker_config.TRACKERS:
        monkeypatch.setitem(tracker_config.TRACKERS, name, ("json",))


def test_names_come_as_a_list_or_comma_separated(installed: None) -> None:
    assert TrackerConfig(track="tensorboard, wandb").track == ["tensorboard", "wandb"]
    assert TrackerConfig(track=["mlflow,wandb", "mlflow"]).track == ["mlflow", "wandb"]
    assert TrackerConfig(track='["wandb"]').track == ["wandb"]
    assert TrackerConfig().track == []


def test_an_unknown_tracker_or_a_missing_package_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(
        SwarmConfigError, match="unknown tracker 'tensorbord'; known: tensorboard, wandb, mlflow"
    ):
        check_names(["tensorbord"])
    monkeypatch.setitem(tracker_config.TRACKERS, "wandb", ("json", "swarmrl_no_such_module"))
    with pytest.raises(SwarmConfigError, match=r"swarmrl_no_such_module.*pip install 'swarmrl\[track\]'"):
        check_installed(["wandb"])


def test_only_where_the_tracker_runs_are_its_packages_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer's machine reads the same description without any tracker package."""
    monkeypatch.setitem(tracker_config.TRACKERS, "wandb", ("swarmrl_no_such_module",))
    swarm = build({"models": {"policy": {}}, "tasks": {"calculator": {}}, "tracker": {"track": "wandb"}}, "t")
    assert swarm.tracker.track == ["wandb"]
    with pytest.raises(SwarmConfigError, match="unknown tracker 'wand'"):
        build({"models": {"policy": {}}, "tasks": {"calculator": {}}, "tracker": {"track": "wand"}}, "t")


def test_up_refuses_a_tracker_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tracker_config.TRACKERS, "mlflow", ("swarmrl_no_such_module",))
    with pytest.raises(SystemExit):
        parse_args(["--track", "mlflow"])


def test_up_starts_a_tracker_only_when_one_is_named(installed: None, tmp_path: Path) -> None:
    def services(swarm_args: list[str]) -> dict[str, object]:
        _, swarm = parse_args(swarm_args)
        return {p.name: p.config for p in plan_services(swarm, {"policy": tmp_path}, tmp_path / "run")}

    assert "tracker" not in services([])
    cfg = services(["--track", "tensorboard,mlflow"])["tracker"]
    assert isinstance(cfg, TrackerConfig)
    assert (cfg.track, cfg.run_dir) == (["tensorboard", "mlflow"], tmp_path / "run")


def test_the_description_names_them_and_the_flag_overrides_it(installed: None, tmp_path: Path) -> None:
    desc = tmp_path / "swarm.toml"
    desc.write_text('[models.policy]\n[tasks.calculator]\n[tracker]\ntrack = ["wandb"]\nproject = "calc"\n')
    _, swarm = parse_args(["--config", str(desc), "--track", "tensorboard"])
    assert (swarm.tracker.track, swarm.tracker.project) == (["tensorboard"], "calc")
