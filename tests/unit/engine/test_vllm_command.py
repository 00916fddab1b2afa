"""The vLLM server's command line (no vLLM needed): LoRA on the decoder layers' linear layers only."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from swarmrl.services.engine.vllm_backend import VLLMServer, layer_linears


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    tensors = {
        "model.embed_tokens.weight": torch.zeros(8, 4),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
        "model.layers.0.self_attn.q_proj.bias": torch.zeros(4),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 4),
        "model.layers.0.input_layernorm.weight": torch.zeros(4),
        "model.norm.weight": torch.zeros(4),
        "lm_head.weight": torch.zeros(8, 4),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_lora_targets_the_layers_linears_and_never_the_output_head(model_dir: Path) -> None:
    assert layer_linears(model_dir) == ["down_proj", "q_proj"]
    cmd = VLLMServer(model_dir, python="python", max_loras=2).command()
    at = cmd.index("--lora-target-modules")
    assert cmd[at + 1 : at + 3] == ["down_proj", "q_proj"] and "--enable-lora" in cmd
    assert "--lora-target-modules" not in VLLMServer(model_dir, python="python").command()  # LoRA off
    mine = VLLMServer(
        model_dir, python="python", max_loras=1, extra_args=["--lora-target-modules", "lm_head"]
    )
    assert mine.command().count("--lora-target-modules") == 1  # the operator's own choice wins


def test_a_directory_without_weights_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no linear layer"):
        layer_linears(tmp_path)
