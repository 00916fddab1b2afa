"""The swarm description: validation names the offending entry; flags override the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.agents.config import parse_task_weights
from swarmrl.swarm import SwarmConfigError, build, load
from swarmrl.up import parse_args

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def team(**overrides: object) -> dict:
    data: dict = {
        "models": {"caller": {"base": "tiny"}, "reporter": {"base": "tiny-llama"}},
        "tasks": {"team_calculator": {"roles": {"caller": "caller", "reporter": "reporter"}}},
    }
    data.update(overrides)
    return data


def test_a_team_swarm_maps_roles_to_models_and_the_first_role_leads() -> None:
    swarm = build(team(), "t")
    assert swarm.task_models("team_calculator") == ["caller", "reporter"]
    assert swarm.num_repeat("team_calculator") == 8 and swarm.weights() == {"team_calculator": 1.0}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (team(tasks={"team_calculator": {"roles": {"caller": "caller", "reporter": "nobody"}}}), "nobody"),
        (team(tasks={"team_calculator": {"roles": {"caller": "caller"}}}), "reporter"),
        (
            team(
                tasks={
                    "team_calculator": {"weight": 0, "roles": {"caller": "caller", "reporter": "reporter"}}
                }
            ),
            "weight",
        ),
        (team(tasks={"nope": {}}), "nope"),
        ({"models": {"a": {}, "b": {}}, "tasks": {"calculator": {}}}, "calculator"),
        ({"models": {"a.b": {}}, "tasks": {"calculator": {}}}, "a.b"),
        ({"models": {"a": {"lr": 0}}, "tasks": {"calculator": {}}}, "models.a.lr"),  # not its table
        ({"models": {"a": {"trainer": {"lr": 0}}}, "tasks": {"calculator": {}}}, "models.a.trainer.lr"),
        ({"models": {"a": {"trainer": {"lrr": 1}}}, "tasks": {"calculator": {}}}, "models.a.trainer.lrr"),
        (
            {"models": {"a": {"trainer": {"run_dir": "x"}}}, "tasks": {"calculator": {}}},
            "set by `swarmrl up`",
        ),
        ({"models": {"a": {}}, "tasks": {"calculator": {}}, "gateway": {"port": 1}}, "gateway.port"),
        (
            {"models": {"a": {}}, "tasks": {"calculator": {}}, "merger": {"merge_mode": "x"}},
            "merger.merge_mode",
        ),
        ({"models": {"a": {"color": 1}}, "tasks": {"calculator": {}}}, "color"),
        ({"models": {"a": {}, "b": {}}, "tasks": {"calculator": {"roles": {"agent": "a"}}}}, "'b'"),
        (
            team(models={"caller": {"trainer": {"num_repeat": 4}}, "reporter": {"base": "tiny-llama"}}),
            "num_repeat",
        ),
    ],
)
def test_a_bad_description_is_refused_with_the_offending_entry_named(data: dict, named: str) -> None:
    with pytest.raises(SwarmConfigError, match="invalid swarm description") as err:
        build(data, "t")
    assert named in str(err.value)


def test_a_mistyped_key_says_what_it_may_have_meant_and_the_environment_plays_no_part(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWARMRL_LR", "not a number")  # read by a process's config, never by a description
    monkeypatch.setenv("SWARMRL_NUM_REPEAT", "1")
    bad = {"models": {"a": {"trainer": {"lrr": 1}}}, "tasks": {"calculator": {"promt": "x"}}}
    with pytest.raises(SwarmConfigError) as err:
        build(bad, "t")
    assert "models.a.trainer.lrr: Extra inputs are not permitted; did you mean 'lr'?" in str(err.value)
    assert "tasks.calculator.promt: Extra inputs are not permitted; did you mean 'prompt'?" in str(err.value)
    # a learning-rate schedule decays to `[run] steps`, which `up` places as the trainer's max_steps
    swarm = build(
        {"models": {"a": {"trainer": {"lr_scheduler": "cosine"}}}, "tasks": {"calculator": {}}}, "t"
    )
    assert (swarm.trainer("a").lr, swarm.trainer("a").num_repeat, swarm.trainer("a").lr_scheduler) == (
        1e-4,
        8,
        "cosine",
    )
    desc = tmp_path / "s.toml"
    desc.write_text("[models.policy.trainer]\nlrr = 1\n[tasks.calculator]\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(desc)])
    err_text = capsys.readouterr().err
    assert "did you mean 'lr'?" in err_text and "usage:" not in err_text  # the error alone, no usage screen


def test_duplicate_tables_and_missing_files_are_named(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text("[models.a]\nbase = 'tiny'\n[models.a]\nbase = 'tiny'\n")
    with pytest.raises(SwarmConfigError, match="not valid TOML.*line 3"):
        load(f)
    with pytest.raises(SwarmConfigError, match="does not exist"):
        load(tmp_path / "missing.toml")


def test_task_weights() -> None:
    assert parse_task_weights("calculator=0.7,guess_number=0.3") == {"calculator": 0.7, "guess_number": 0.3}
    assert parse_task_weights("calculator") == {"calculator": 1.0}
    with pytest.raises(SwarmConfigError, match="twice"):
        parse_task_weights("a,a")
    with pytest.raises(SwarmConfigError, match="not a number"):
        parse_task_weights("a=x")


def test_flags_override_the_file_and_a_missing_base_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, swarm = parse_args(
        ["--config", str(EXAMPLES / "team.toml"), "--minutes", "3", "--lr", "5e-5", "--clients", "0"]
    )
    assert (
        swarm.run.minutes == 3 and swarm.trainer("reporter").lr == 5e-5 and swarm.trainer("caller").lr == 5e-5
    )
    assert swarm.tasks["team_calculator"].clients == 0
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--model", str(tmp_path / "no-such-model")])
    assert exit_.value.code == 2 and "no-such-model" in capsys.readouterr().err


def test_the_short_form_is_one_model_policy_with_weighted_tasks() -> None:
    _, swarm = parse_args(["--task", "calculator=0.7,guess_number=0.3", "--clients", "1"])
    assert list(swarm.models) == ["policy"]
    assert {n: t.roles for n, t in swarm.tasks.items()} == {
        "calculator": {"agent": "policy"},
        "guess_number": {"agent": "policy"},
    }
    assert swarm.weights() == pytest.approx({"calculator": 0.7, "guess_number": 0.3})


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_every_shipped_example_is_valid(name: str) -> None:
    assert parse_args(["--config", str(EXAMPLES / name)])[1].tasks


HUB = """
import sys
from swarmrl.core.config import SwarmConfigError
from swarmrl.swarm import build
try:
    swarm = build({"models": {"policy": {"base": sys.argv[1]}}, "tasks": {"calculator": {}}}, "test")
    from swarmrl.swarm import check_bases, resolve_base
    check_bases(swarm)
    print("DIR", resolve_base(swarm.models["policy"]))
except SwarmConfigError as exc:
    print("ERROR", exc)
"""


def test_a_hub_id_is_found_in_the_hub_cache_or_refused_offline_saying_how(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A base like `Qwen/Qwen2.5-0.5B-Instruct`: the model from the Hugging Face cache when it is
    there (no network needed), else, offline, an error naming the id and how to bring the weights in."""
    import os
    import shutil
    import subprocess
    import sys

    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-chat" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir, snapshot)
    (cache / "models--acme--tiny-chat" / "refs").mkdir()
    (cache / "models--acme--tiny-chat" / "refs" / "main").write_text("0123abcd")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}

    def run(base: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", HUB, base], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]

    assert run("acme/tiny-chat") == f"DIR {snapshot}"
    missing = run("acme/absent-model")
    assert missing.startswith(
        "ERROR [models.policy].base: 'acme/absent-model' looks like a Hugging Face hub id"
    )
    assert "huggingface-cli download acme/absent-model --local-dir DIR" in missing


def lora_team(**reporter: object) -> dict:
    lora = {"base": "tiny", "trainer": {"lora_rank": 8}}
    return team(models={"caller": dict(lora), "reporter": {**lora, "share_engine": "caller", **reporter}})


def test_lora_models_share_one_engine_that_serves_each_as_an_adapter(tmp_path: Path) -> None:
    from swarmrl.launch import plan_services

    swarm = build(lora_team(), "t")
    assert swarm.engine_owner("reporter") == "caller" and swarm.adapters("caller") == ["caller", "reporter"]
    procs = {p.name: p.config for p in plan_services(swarm, dict.fromkeys(swarm.models, tmp_path), tmp_path)}
    assert "engine-reporter" not in procs and procs["engine-caller"].adapters == ["caller", "reporter"]
    gateway = procs["gateway"]
    url = f"http://127.0.0.1:{procs['engine-caller'].port}"
    assert gateway.engine == [f"caller={url}", f"reporter={url}"] and gateway.lora == ["caller", "reporter"]
    alone = build(
        team(models={"caller": {"trainer": {"lora_rank": 8}}, "reporter": {"base": "tiny-llama"}}), "t"
    )
    procs = {p.name: p.config for p in plan_services(alone, dict.fromkeys(alone.models, tmp_path), tmp_path)}
    assert procs["engine-caller"].adapters == ["caller"] and procs["engine-reporter"].adapters == []


def test_replicas_start_pools_of_engines_and_several_gateways(tmp_path: Path) -> None:
    from swarmrl.launch import plan_services

    swarm = build(lora_team(), "t")
    swarm.replicas.engine, swarm.replicas.gateway, swarm.replicas.merger, swarm.replicas.ledger = 2, 3, 2, 2
    procs = {p.name: p.config for p in plan_services(swarm, dict.fromkeys(swarm.models, tmp_path), tmp_path)}
    engines = [f"http://127.0.0.1:{procs[f'engine-caller-{i}'].port}" for i in range(2)]
    assert len(set(engines)) == 2 and "engine-reporter-0" not in procs  # the adapters share the pool
    gateways = [procs[f"gateway-{i}"] for i in range(3)]
    assert len({g.port for g in gateways}) == 3
    # every gateway routes each model to the whole pool
    assert all(g.engine == [f"{m}={u}" for m in ("caller", "reporter") for u in engines] for g in gateways)
    assert [procs[f"merger-{i}"].replica for i in range(2)] == ["merger-0", "merger-1"]
    assert [procs[f"ledger-{i}"].replica for i in range(2)] == ["ledger-0", "ledger-1"]
    assert len({procs[f"ledger-{i}"].run_dir for i in range(2)}) == 1  # one run dir, partition folders


@pytest.mark.parametrize(
    ("reporter", "named"),
    [
        ({"share_engine": "nobody"}, "unknown model 'nobody'"),
        ({"trainer": {}}, "reporter trains all weights"),
        ({"base": "tiny-llama"}, "same base"),
        ({"engine": {"max_batch": 4}}, "set engine settings there"),
    ],
)
def test_a_shared_engine_needs_two_lora_models_of_one_base(reporter: dict, named: str) -> None:
    with pytest.raises(SwarmConfigError, match=named):
        build(lora_team(**reporter), "t")
