"""Bad values never reach the weights: the learner's guards on the project's real tiny model.

No torch function is mocked: the non-finite losses come from real inputs (an advantage beyond
float32, rewards whose group mean overflows), the non-finite weights from a real AdamW step.
"""

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.grpo import score_group
from swarmrl.services.trainer.learner import Learner, NonFiniteWeights
from tests.unit.trainer.samples import OVERFLOWING_ADAMW, make_sample

VOCAB = 500  # token ids drawn below the tiny model's vocabulary (about 800)


@pytest.fixture
def cfg(tiny_model_dir: Path, tmp_path: Path) -> TrainerConfig:
    return TrainerConfig(
        model_path=str(tiny_model_dir), run_dir=str(tmp_path), lr=1e-3, max_tokens_per_micro_batch=64
    )


def _items(name: str, advantages: list[float]) -> list[Scored]:
    return [
        Scored(make_sample(f"{name}{i}", 1.0, prompt=6, gen=8, vocab=VOCAB), a)
        for i, a in enumerate(advantages)
    ]


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.accelerator.unwrap_model(learner.model).state_dict().items()}


def test_an_update_with_a_nonfinite_loss_is_not_applied_and_training_goes_on(cfg: TrainerConfig) -> None:
    learner = Learner(cfg, cfg.model_path)
    before = _weights(learner)
    bad = _items("bad", [1e39, 1e39])  # finite in Python, inf once packed as float32: the loss is -inf
    result = learner.train_step(bad, version=0)
    assert not result.learned
    assert set(result.skipped) == {it.sample.sample_id for it in bad}
    assert all(r.startswith("nonfinite: loss -inf") for r in result.skipped.values()), result.skipped
    assert result.stats["skipped_updates"] == result.stats["updates"] == 1
    assert all(math.isfinite(v) for v in result.stats.values()), result.stats
    for name, tensor in _weights(learner).items():
        torch.testing.assert_close(tensor, before[name])  # not a single bit moved
    assert not learner.optimizer.state_dict()["state"]  # nor did Adam's moments: no step was taken

    good = learner.train_step(_items("good", [1.0, -1.0]), version=0)
    assert good.learned and not good.skipped and good.stats["skipped_updates"] == 0
    assert good.stats["grad_norm"] > 0
    learner.check_weights("after the good step")


def test_rewards_that_pass_the_schema_but_overflow_the_group_mean_are_refused(cfg: TrainerConfig) -> None:
    # Finite rewards, so the wire accepts them; their sum overflows, so every GRPO advantage is NaN.
    group = [make_sample(f"e{i}", r, vocab=VOCAB) for i, r in enumerate([1.7e308, 1.7e308, 0.0, 0.0])]
    score = score_group(group, 0, max_staleness=4, min_group_size=2)
    assert score.status == "ok" and all(math.isnan(a) for a in score.advantages)
    learner = Learner(cfg, cfg.model_path)
    result = learner.train_step([Scored(s, a) for s, a in zip(group, score.advantages, strict=True)], 0)
    assert not result.learned and len(result.skipped) == 4
    assert all(r.startswith("nonfinite: loss nan") for r in result.skipped.values())
    learner.check_weights("after the refused step")


def test_only_the_bad_update_of_a_step_is_skipped(cfg: TrainerConfig) -> None:
    # One sample per micro-batch and one micro-batch per update: two updates, the second one bad.
    cfg = cfg.model_copy(update={"grad_accum": 1, "max_tokens_per_micro_batch": 14})
    learner = Learner(cfg, cfg.model_path)
    good, bad = _items("good", [1.0]), _items("bad", [1e39])
    result = learner.train_step(good + bad, version=0)
    assert result.learned and result.stats["updates"] == 2 and result.stats["skipped_updates"] == 1
    assert list(result.skipped) == [bad[0].sample.sample_id]
    assert result.stats["trained_tokens"] == 8  # the good sample's generated tokens only
    assert all(math.isfinite(v) for v in result.stats.values()), result.stats
    learner.check_weights("after a half-applied step")


def test_save_refuses_weights_a_real_adamw_step_made_infinite(cfg: TrainerConfig, tmp_path: Path) -> None:
    learner = Learner(cfg.model_copy(update=OVERFLOWING_ADAMW), cfg.model_path)
    result = learner.train_step(_items("e", [1.0, -1.0]), version=0)
    assert result.learned and math.isfinite(result.stats["loss"])  # loss and gradients were finite
    final = tmp_path / "checkpoints" / "tiny" / "step-1"
    with pytest.raises(NonFiniteWeights, match=r"for step-1: \d+ parameter tensors hold NaN or inf"):
        learner.save(final, TrainerState("tiny", 1, 1))
    assert not final.exists() and not final.with_name("step-1.tmp").exists()  # nothing written


def test_nonfinite_weights_on_disk_are_refused_at_load(cfg: TrainerConfig, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(cfg.model_path)
    with torch.no_grad():
        model.get_input_embeddings().weight[3, 0] = math.nan  # e.g. a checkpoint from an older trainer
    model.save_pretrained(tmp_path / "broken")
    with pytest.raises(NonFiniteWeights, match=r"loaded from .*broken: 1 parameter tensors"):
        Learner(cfg, tmp_path / "broken")
