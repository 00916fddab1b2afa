"""Presets and SFT sources: the default stays today's model, role sources warm-start, bad names fail early."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.agents.tasks import TASKS
from swarmrl.bootstrap import (
    PRESETS,
    TinyDims,
    build_model,
    build_tokenizer,
    cli,
    default_model_dir,
    default_steps,
    ensure_model,
    evaluate_offline,
    evaluate_team,
    model_dir,
    source_names,
    validate_base,
)
from swarmrl.bootstrap import tokenizer as tokenizer_module
from swarmrl.bootstrap.sft import demonstration_batches, encode_episode, source_demonstration


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tiny_is_the_default_model_and_pins_its_sources():
    tiny = PRESETS["tiny"]
    assert (tiny.architecture, tiny.dims, tiny.steps) == ("qwen2", TinyDims(), 1250)
    # What `sorted(TASKS)` was before multi-role tasks: adding tasks must not change its weights.
    assert tiny.sources == ("calculator", "guess_number")
    assert default_steps("tiny") == 1250 and default_model_dir() == model_dir("tiny", None, 1250, 0)
    assert PRESETS["tiny-llama"].architecture == "llama"


def test_default_tokenizer_corpus_ignores_tasks_added_later(monkeypatch: pytest.MonkeyPatch):
    corpus = list(tokenizer_module._corpus(0, episodes_per_task=20))
    monkeypatch.setattr(tokenizer_module, "TASKS", {n: TASKS[n] for n in ("guess_number", "calculator")})
    assert list(tokenizer_module._corpus(0, episodes_per_task=20)) == corpus


def test_default_demo_stream_is_the_tiny_presets(tokenizer):
    default = demonstration_batches(tokenizer, 2, seed=0)
    pinned = demonstration_batches(tokenizer, 2, seed=0, sources=["calculator", "guess_number"])
    for _ in range(5):
        a, b = default(), pinned()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_sources_list_tasks_and_roles():
    assert source_names() == [
        "calculator",
        "guess_number",
        "team_calculator.caller",
        "team_calculator.reporter",
    ]
    # A role's warm start: 250 rounds of its batches (caller with and without tools, role_sft_weights).
    assert default_steps("tiny", ["team_calculator.caller"]) == 1000
    assert default_steps("tiny-llama", ["team_calculator.reporter"]) == 750  # role_sft_weights 3


@pytest.mark.parametrize(
    ("preset", "sources", "needle"),
    [
        ("huge", None, "unknown preset 'huge'; valid presets: tiny, tiny-llama"),
        ("tiny", ["team_calculator"], "name one of its roles"),
        (
            "tiny",
            ["team_calculator.judge"],
            "valid sources: calculator, guess_number, team_calculator.caller",
        ),
        ("tiny", ["calculator", "calculator"], "named twice"),
        ("tiny", [], "empty SFT sources"),
    ],
)
def test_bad_names_raise_with_the_valid_ones(preset, sources, needle, tmp_path: Path):
    with pytest.raises(ValueError) as info:
        validate_base(preset, sources)
    assert needle in str(info.value)
    with pytest.raises(ValueError):
        build_model(tmp_path / "m", preset=preset, sources=sources, warm_start_steps=0)
    assert not (tmp_path / "m").exists()  # refused before building anything


def test_cli_refuses_bad_names(capsys: pytest.CaptureFixture[str]):
    assert cli.main(["--preset", "huge"]) == 2
    assert cli.main(["--sources", "calculator,team_calculator.judge"]) == 2
    assert "team_calculator.reporter" in capsys.readouterr().err


def test_validate_base_accepts_good_names():
    validate_base("tiny")
    validate_base("tiny-llama", ["team_calculator.reporter"])
    validate_base("tiny", "calculator,team_calculator.caller")  # the flag's comma form


@pytest.mark.parametrize("source", ["team_calculator.caller", "team_calculator.reporter"])
def test_role_demos_encode_with_the_roles_tools(tokenizer, source):
    demonstrate, tools = source_demonstration(source)
    assert tools == TASKS["team_calculator"].role_tools.get(source.split(".")[1])
    messages = demonstrate(next(TASKS["team_calculator"].train_tasks(0)), random.Random(3))
    ids, mask = encode_episode(tokenizer, messages, tools)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    reply = messages[-1]
    if reply.get("tool_calls"):
        arguments = reply["tool_calls"][0]["function"]["arguments"]
        assert (
            trained
            == f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call><|im_end|>'
        )
    else:
        assert trained == f"{reply['content']}<|im_end|>"


def test_role_batches_show_tool_roles_with_and_without_tools(tokenizer):
    next_batch = demonstration_batches(
        tokenizer, 2, seed=0, sources=["team_calculator.caller", "team_calculator.reporter"]
    )
    # One round: (caller with tools, caller without) x 2, reporter x 3 (role_sft_weights).
    long = [next_batch()["prefix_ids"].shape[1] > 150 for _ in range(7)]
    assert long == [True, False, True, False, False, False, False]


def test_llama_role_preset_builds_and_loads(tmp_path: Path):
    out = build_model(
        tmp_path / "m",
        preset="tiny-llama",
        sources=["team_calculator.reporter"],
        warm_start_steps=2,
        progress=False,
    )
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == PRESETS["tiny-llama"].dims.hidden_size
    meta = json.loads((out / "meta.json").read_text())
    assert meta["preset"] == "tiny-llama" and meta["sources"] == ["team_calculator.reporter"]
    assert meta["warm_start_steps"] == 2 and meta["final_sft_loss"] > 0
    tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok.encode("<|im_start|>assistant\n", add_special_tokens=False)])
    assert model.generate(ids, max_new_tokens=3, do_sample=True).shape[1] > ids.shape[1]


def test_ensure_model_caches_per_preset_and_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path))
    path = ensure_model("tiny", ["team_calculator.caller"], steps=0, progress=False)
    assert path.parent == tmp_path / "models"
    assert path.name.startswith("tiny-team_calculator.caller-0s-seed0-")
    assert ensure_model("tiny", ["team_calculator.caller"], steps=0) == path  # cached: no rebuild
    assert [p.name for p in (tmp_path / "models").iterdir()] == [path.name]  # no temp dir left
    others = {
        model_dir("tiny-llama", ["team_calculator.caller"], 0),
        model_dir("tiny", ["team_calculator.reporter"], 0),
        model_dir("tiny", ["team_calculator.caller"], 1),
        model_dir("tiny", ["team_calculator.caller"], 0, seed=1),
    }
    assert path not in others and len(others) == 4
    with pytest.raises(ValueError, match="valid presets"):
        ensure_model("huge")


def test_role_eval_scripts_the_partner(tiny_model_dir: Path):
    r = evaluate_offline(tiny_model_dir, "team_calculator.reporter", n=4, max_new_tokens=4)
    assert r.role == "reporter" and r.episodes == 4 and r.mean_turns == 1.0
    assert r.metrics["caller_valid"] == 1.0  # the scripted caller is always right
    assert r.metric == r.metrics["reporter_correct"] == r.mean_reward
    r = evaluate_offline(tiny_model_dir, "team_calculator.caller", n=4, max_new_tokens=4)
    assert r.role == "caller" and r.metric == r.metrics["caller_valid"]
    # Nobody's model: the scripted team always wins.
    assert evaluate_team({}, "team_calculator", n=4).success_rate == 1.0
    with pytest.raises(ValueError, match="team_calculator.caller"):
        evaluate_offline(tiny_model_dir, "team_calculator", n=1)
    with pytest.raises(ValueError, match="no roles"):
        evaluate_offline(tiny_model_dir, "calculator.caller", n=1)
