"""build_model: a plain HF directory that loads, generates, and is deterministic for a seed."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from swarmrl.agents.tasks import TASKS
from swarmrl.bootstrap import (
    TinyDims,
    build_model,
    build_tokenizer,
    default_model_dir,
    evaluate_offline,
    source_names,
)
from swarmrl.bootstrap.sft import demonstration_batches, encode_episode, sft_loss, source_demonstration

SMALL = TinyDims(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)


def test_loads_with_auto_classes_and_generates(tiny_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=5, do_sample=True)
    assert out.shape[1] > ids.shape[1]
    meta = json.loads((tiny_model_dir / "meta.json").read_text())
    assert meta["seed"] == 0 and meta["warm_start_steps"] == 0
    assert 1_000_000 <= meta["param_count"] <= 20_000_000


def test_same_seed_same_weights(tmp_path: Path):
    a = build_model(tmp_path / "a", seed=3, warm_start_steps=2, progress=False, dims=SMALL)
    b = build_model(tmp_path / "b", seed=3, warm_start_steps=2, progress=False, dims=SMALL)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((a / "meta.json").read_text())["final_sft_loss"] > 0


def test_loss_mask_covers_exactly_the_replies():
    tokenizer = build_tokenizer()
    spec = TASKS["calculator"]
    messages = spec.demonstration(next(spec.train_tasks(0)), random.Random(0))
    ids, mask = encode_episode(tokenizer, messages, spec.tools)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    call = messages[2]["tool_calls"][0]["function"]
    expected = (
        f'<tool_call>\n{{"name": "calculator", "arguments": {call["arguments"]}}}\n</tool_call><|im_end|>'
        f"{messages[4]['content']}<|im_end|>"
    )
    assert trained == expected
    # The ids are the prompt the gateway would send, extended by the generated replies.
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(
        messages, tools=spec.tools, tokenize=False
    ).rstrip("\n")


@pytest.mark.filterwarnings("error::FutureWarning")  # a deprecated argument (`past_key_values`) goes in 5.40
def test_shared_prefix_loss_equals_full_sequence_loss():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, **asdict(SMALL))
    model = Qwen2ForCausalLM(config)
    next_batch = demonstration_batches(tokenizer, batch_size=3, seed=0)
    widths = []
    for _ in range(5):  # one round: calculator with and without tool specs (twice), guess_number
        batch = next_batch()
        prefix = batch["prefix_ids"].expand(3, -1)
        widths.append(prefix.shape[1])
        assert prefix.shape[1] > 20  # at least the system prompt is shared
        full_ids = torch.cat([prefix, batch["input_ids"]], dim=1)
        full_labels = torch.cat([torch.full_like(prefix, -100), batch["labels"]], dim=1)
        expected = model(input_ids=full_ids, labels=full_labels).loss
        assert torch.allclose(sft_loss(model, batch), expected, atol=1e-5)
    assert max(widths) > 150  # the tool specs are part of the shared prefix


def test_default_dir_follows_swarmrl_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path))
    path = default_model_dir(seed=1)
    assert path.parent == tmp_path / "models" and path.name.startswith("tiny-")
    assert path != default_model_dir(seed=2)


def test_evaluate_offline_runs(tiny_model_dir: Path):
    result = evaluate_offline(tiny_model_dir, "guess_number", n=3, max_new_tokens=4)
    assert result.episodes == 3 and 0.0 <= result.success_rate <= 1.0


def test_auto_tokenizer_matches_the_built_one(tiny_model_dir: Path):
    """transformers may pick its own class for the directory (Qwen2Tokenizer): ids must not change."""
    loaded, built = AutoTokenizer.from_pretrained(tiny_model_dir), build_tokenizer()
    rng = random.Random(0)
    for source in source_names():
        demonstrate, tools = source_demonstration(source)
        messages = demonstrate(next(TASKS[source.split(".")[0]].train_tasks(0)), rng)
        text = loaded.apply_chat_template(messages, tools=tools, tokenize=False)
        assert text == built.apply_chat_template(messages, tools=tools, tokenize=False)
        ids = loaded.encode(text, add_special_tokens=False)
        assert ids == built.encode(text, add_special_tokens=False)
        assert loaded.decode(ids) == text
    assert loaded.convert_tokens_to_ids(["<tool_call>", "<|im_end|>"]) == built.convert_tokens_to_ids(
        ["<tool_call>", "<|im_end|>"]
    )
