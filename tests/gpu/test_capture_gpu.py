"""Token-exact capture on the GPU: the logprob the engine returns with each sampled token is the one
the trainer recomputes for it, so on-policy samples start their step at a PPO ratio of 1.

Sampled at temperature 1, which the trainer assumes (it does not divide its logits by T).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmrl.schemas import Sample
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.trainer.batching import Scored, pack, pack_shared
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import Learner
from tests.gpu.device import DEVICE, DEVICE_TYPE, LOGPROB_ATOL, needs_device
from tests.unit.engine.helpers import params
from tests.unit.trainer.samples import make_sample

pytestmark = [pytest.mark.gpu, needs_device]

GROUPS = {"g0": [5, 17, 33, 90, 4, 61, 2], "g1": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]}
REWARDS = [1.0, 0.0, 0.5, 0.0]


def engine_samples(engine: EngineCore, group: str, prompt: list[int], **sp: float) -> list[Sample]:
    """One GRPO group of the engine's own completions of `prompt`, with the logprobs it returned."""
    futures = [
        engine.submit(prompt, params(engine, temperature=1.0, ignore_eos=True, seed=seed, **sp))
        for seed in range(len(REWARDS))
    ]
    samples = []
    for i, (fut, reward) in enumerate(zip(futures, REWARDS, strict=True)):
        out = fut.result(60)
        base = make_sample(
            f"{group}-ep{i}", reward, group=group, prompt=len(prompt), gen=len(out.output_ids), model="tiny"
        )
        update = {"token_ids": prompt + out.output_ids, "logprobs": [0.0] * len(prompt) + out.output_logprobs}
        samples.append(base.model_copy(update=update))
    return samples


def test_the_trainer_recomputes_the_engines_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = EngineCore(tiny_model_dir, max_batch=8, device=DEVICE)
    try:
        samples = [
            s for g, prompt in GROUPS.items() for s in engine_samples(engine, g, prompt, max_new_tokens=12)
        ]
    finally:
        engine.close()
    assert len({tuple(s.token_ids) for s in samples}) > len(GROUPS)  # the answers differ
    cfg = TrainerConfig(model_path=str(tiny_model_dir), run_dir=str(tmp_path), max_tokens_per_micro_batch=64)
    learner = Learner(cfg, cfg.model_path)
    assert learner.accelerator.device.type == DEVICE_TYPE
    items = [Scored(s, s.reward - 0.375) for s in samples]
    for layout in (pack_shared, pack):
        for mb in layout(items, 64):
            recomputed = learner._logprobs(learner.model, mb).cpu()
            torch.testing.assert_close(recomputed, mb.behaviour, atol=LOGPROB_ATOL, rtol=0)
    stats = learner.train_step(items, version=0).stats
    assert stats["trained_tokens"] == 12 * len(samples)
    assert (
        stats["clip_frac"] == 0.0
        and stats["off_policy_frac"] == 0.0
        and stats["unknown_behaviour_frac"] == 0.0
    )
