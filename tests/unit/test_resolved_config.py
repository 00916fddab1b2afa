"""One configuration flowing down: what `swarmrl up` hands each process is exactly what `swarmrl serve
NAME --config swarm.toml` resolves on any machine, field by field, and every default is declared once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarmrl.core.config import UNFILED
from swarmrl.launch import plan_services, spawn_services
from swarmrl.swarm import CONFIGS, build, load, resolve_base
from swarmrl.up import parse_args

SWARM = """
[run]
seed = 7
steps = 40

[models.policy]
base = "tiny"

[models.policy.trainer]
lr = 3e-4
kl_coef = 0.01

[models.policy.engine]
max_batch = 8

[tasks.calculator]
weight = 0.7

[tasks.guess_number]
weight = 0.3

[gateway]
mix_slack = 3.0

[merger]
episode_timeout_s = 60.0
"""


class Recorder:
    """Records what `spawn_services` would start (the real `Supervisor` would run it)."""

    def __init__(self) -> None:
        self.argv: dict[str, list[str]] = {}

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, role: str = "") -> None:
        self.argv[name] = argv


def _printed(argv: list[str]) -> dict[str, Any]:
    """Run a `swarmrl` command line with `--print-config` and parse what it prints."""
    out = subprocess.run(
        [sys.executable, *argv, "--print-config"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_up_and_serve_resolve_every_service_field_by_field(tmp_path: Path) -> None:
    desc = tmp_path / "swarm.toml"
    desc.write_text(SWARM)
    _, swarm = parse_args(["--config", str(desc), "--batch-groups", "2", "--trainer-arg=--max-staleness=2"])
    run_dir = tmp_path / "run"
    model_dir = resolve_base(swarm.models["policy"], build=False)
    procs = plan_services(swarm, {"policy": model_dir}, run_dir)
    sup = Recorder()
    spawn_services(sup, procs, run_dir, "nats://127.0.0.1:4222")  # type: ignore[arg-type]

    # the flags became settings of the file's description (the other flag-less fields keep it)
    trainer = next(p.config for p in procs if p.service == "trainer")
    assert (trainer.lr, trainer.kl_coef, trainer.batch_groups, trainer.max_staleness) == (3e-4, 0.01, 2, 2)
    assert (trainer.seed, trainer.max_steps) == (7, 40)

    up_desc = tmp_path / "swarm-as-up-ran-it.toml"  # the description with up's flags folded in
    up_desc.write_text(SWARM.replace("kl_coef = 0.01", "kl_coef = 0.01\nbatch_groups = 2\nmax_staleness = 2"))
    for proc in procs:
        # 1. what the process itself reads from the file up wrote for it
        argv = sup.argv[proc.name]
        assert argv[-2] == "--config" and Path(argv[-1]) == run_dir / "config" / f"{proc.name}.json"
        as_started = _printed(argv)
        # 2. what `serve NAME --config swarm.toml` resolves on another machine, given its placement
        where = {f: v for f, v in as_started.items() if f in ("port", "run_dir", "engine", "host")}
        flags = [arg for f, v in where.items() for arg in _flag(f, v)]
        alone = _printed(["-m", "swarmrl.cli", "serve", proc.service, "--config", str(up_desc), *flags])
        assert as_started == alone, proc.name
        # 3. and both are the object up resolved, every field of the service's class
        fields = set(CONFIGS[proc.service].model_fields) - UNFILED
        assert set(as_started) == fields and as_started == json.loads(
            proc.config.model_dump_json(include=fields)
        )


def _flag(field: str, value: Any) -> list[str]:
    name = "--" + field.replace("_", "-")
    return [arg for v in value for arg in (name, str(v))] if isinstance(value, list) else [name, str(value)]


def test_a_flag_overrides_the_file_and_the_file_must_be_the_services(tmp_path: Path) -> None:
    desc = tmp_path / "swarm.toml"
    desc.write_text(SWARM)
    swarm = build(load(desc), str(desc))
    procs = plan_services(swarm, {"policy": tmp_path}, tmp_path / "run")
    sup = Recorder()
    spawn_services(sup, procs, tmp_path / "run", "nats://127.0.0.1:4222")  # type: ignore[arg-type]
    assert _printed([*sup.argv["trainer"], "--lr", "5e-4"])["lr"] == 5e-4
    out = subprocess.run(
        [sys.executable, "-m", "swarmrl.cli", "serve", "merger", "--config", str(tmp_path / "run/config/trainer.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0 and "not a resolved configuration of merger (service: 'trainer')" in out.stderr


@pytest.mark.parametrize(
    ("service", "field", "declared"),
    [("trainer", "lr", 1e-4), ("trainer", "num_repeat", 8), ("trainer", "max_tokens_per_micro_batch", 512),
     ("gateway", "max_backlog", -1)],
)  # fmt: skip
def test_the_defaults_up_used_to_redeclare_are_the_services_own(
    service: str, field: str, declared: Any
) -> None:
    """Once `up` said lr 1e-4 and the trainer alone 1e-5 (group size 8 vs 4, micro-batch 512 vs
    4096, backlog -1 vs 0): a trainer started by hand trained differently. Now `up`'s flag help
    and the service read the one declaration."""
    assert CONFIGS[service].model_fields[field].default == declared
    help_text = " ".join(parse_args.__globals__["build_parser"]().format_help().split())
    assert f"(default {declared})" in help_text
