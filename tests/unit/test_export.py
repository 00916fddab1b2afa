"""`swarmrl export`: a checkpoint the real trainer wrote comes out as an HF model directory that
transformers loads with the trained model's logits."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.export import PROVENANCE, main
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState, checkpoint_root, step_dir
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import Learner
from tests.unit.trainer.samples import make_sample

MESSAGES = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A run directory with checkpoints of steps 1 and 2 of `policy`, and the model as trained."""
    run = tmp_path_factory.mktemp("run")
    cfg = TrainerConfig(model_path=str(tiny_model_dir), run_dir=str(run), lr=1e-2)
    learner = Learner(cfg, cfg.model_path)
    items = [Scored(make_sample(f"e{i}", 1.0, prompt=6, gen=8, vocab=500), 1.0) for i in range(2)]
    for step in (1, 2):
        learner.train_step(items, version=step - 1)
        learner.save(step_dir(checkpoint_root(run, "policy"), step), TrainerState("policy", step, step))
    return run, copy.deepcopy(learner.accelerator.unwrap_model(learner.model)).eval()


def _logits(model: torch.nn.Module, tok_dir: Path) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        return model(input_ids=ids["input_ids"]).logits


def test_export_as_trained_gives_identical_logits(trained, tiny_model_dir: Path, tmp_path: Path) -> None:
    run, model = trained
    assert main([str(run), "--model", "policy", "--to", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert not list(out.glob("*.pt")) and not (out / "trainer_state.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(_logits(loaded, out), _logits(model, out))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert not torch.equal(_logits(base, out), _logits(model, out))  # trained: not the base weights
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    info = json.loads((out / PROVENANCE).read_text())
    assert (info["model"], info["step"], info["policy_version"]) == ("policy", 2, 2)


def test_export_in_bf16_is_the_trained_model_in_bf16(trained, tmp_path: Path) -> None:
    run, model = trained
    out = tmp_path / "bf16"
    assert main([str(run), "--model", "policy", "--to", str(out), "--dtype", "bf16", "--step", "2"]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert next(loaded.parameters()).dtype == torch.bfloat16
    trained_weights = model.state_dict()
    for name, tensor in loaded.state_dict().items():  # every weight: the trained one, rounded to bf16
        assert torch.equal(tensor, trained_weights[name].to(torch.bfloat16)), name
    torch.testing.assert_close(_logits(loaded, out).float(), _logits(model, out), atol=0.05, rtol=0.02)
    assert (out / "model.safetensors").stat().st_size < 0.6 * (
        run / "checkpoints/policy/step-2/model.safetensors"
    ).stat().st_size


def test_export_errors_say_what_to_give(trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = trained
    assert main([str(run), "--model", "critic", "--to", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of model 'critic'" in err and "['policy']" in err
    assert main([str(run), "--model", "policy", "--to", str(tmp_path / "a"), "--step", "7"]) == 2
    assert "kept: [1, 2]" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    assert main([str(run), "--model", "policy", "--to", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "full" / "x").read_text() == "keep me"
    assert main([str(tmp_path), "--model", "policy", "--to", str(tmp_path / "b")]) == 2
    assert "no checkpoints/ folder" in capsys.readouterr().err


def test_a_lora_model_exports_merged_into_its_base_or_as_its_adapter(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    cfg = TrainerConfig(model_path=str(tiny_model_dir), run_dir=str(run), lr=1e-2, lora_rank=4)
    learner = Learner(cfg, cfg.model_path)
    items = [Scored(make_sample(f"e{i}", 1.0, prompt=6, gen=8, vocab=500), 1.0) for i in range(2)]
    learner.train_step(items, version=0)
    learner.save(step_dir(checkpoint_root(run, "policy"), 1), TrainerState("policy", 1, 1))
    trained = learner.accelerator.unwrap_model(learner.model).eval()
    assert main([str(run), "--model", "policy", "--to", str(tmp_path / "merged")]) == 0
    merged = tmp_path / "merged"
    assert not (merged / "adapter_config.json").exists() and (merged / "config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(merged).eval()
    torch.testing.assert_close(_logits(loaded, merged), _logits(trained, merged), atol=1e-5, rtol=1e-5)
    assert json.loads((merged / PROVENANCE).read_text())["lora"] == "merged"
    assert main([str(run), "--model", "policy", "--to", str(tmp_path / "adapter"), "--adapter"]) == 0
    names = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names
