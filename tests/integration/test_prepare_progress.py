"""`up` is never silent for minutes while it builds a model: `prepare_models` (what `up` runs before
any service, with or without the live table) prints a line when it starts, one every
`PREPARE_SAY_S` while the model builds, and one when it is ready; a cached model says nothing."""

from __future__ import annotations

import re

from swarmrl import up
from swarmrl.swarm import Swarm


def test_building_a_model_prints_progress_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path))  # an empty model cache: the model is built
    monkeypatch.setattr(up, "PREPARE_SAY_S", 0.2)  # the real one is 30 s; the lines are the same
    swarm = Swarm.model_validate(
        {"models": {"policy": {"base": "tiny-llama", "warm_start_steps": 40}}, "tasks": {"calculator": {}}}
    )
    dirs = up.prepare_models(swarm)
    assert (dirs["policy"] / "config.json").exists()
    out = capsys.readouterr().out
    assert "swarmrl up: preparing model(s) policy (built or converted once, then cached)" in out
    assert re.search(r"swarmrl up: still preparing policy: \d+s", out), out
    assert re.search(r"swarmrl up: model\(s\) policy ready in \d+s", out), out

    assert up.prepare_models(swarm) == dirs  # cached: found, not built, and nothing said
    assert "preparing" not in capsys.readouterr().out
