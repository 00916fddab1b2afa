import math

import pytest
import torch

from swarmrl.services.trainer.grpo import check_sample, score_group, staleness, token_loss
from tests.unit.trainer.samples import make_sample

KW = dict(max_staleness=4, min_group_size=2)


def test_advantages_on_known_rewards() -> None:
    group = [make_sample(f"e{i}", r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    score = score_group(group, 0, **KW)
    assert score.status == "ok"
    assert score.advantages == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)  # mean .5, population std .5
    assert (score.reward_mean, score.reward_std) == pytest.approx((0.5, 0.5))


def test_multi_sample_episode_shares_advantage_and_per_episode_norm_differs() -> None:
    group = [
        make_sample("e1", 1.0, index=0, n_samples=2),
        make_sample("e1", 1.0, index=1, n_samples=2),
        make_sample("e2", 0.0),
    ]
    per_sample = score_group(group, 0, **KW)
    std = math.sqrt(2 / 9)  # pool [1, 1, 0]: mean 2/3
    assert per_sample.advantages == pytest.approx([(1 / 3) / std, (1 / 3) / std, -(2 / 3) / std], abs=1e-5)
    per_episode = score_group(group, 0, per_episode_norm=True, **KW)  # pool [1, 0]
    assert per_episode.advantages == pytest.approx([1.0, 1.0, -1.0], abs=1e-5)


def test_equal_rewards_are_skipped_or_trained_with_zero_advantage() -> None:
    group = [make_sample(f"e{i}", 0.5) for i in range(4)]
    assert score_group(group, 0, **KW).status == "zero_adv"
    kept = score_group(group, 0, skip_zero_adv=False, **KW)
    assert kept.status == "ok" and kept.advantages == [0.0] * 4


def test_staleness_filter() -> None:
    s = make_sample("e1", 1.0, version=3)
    assert staleness(s, 7) == 4
    assert staleness(s, 2) == 0  # a version from the future is not stale
    group = [
        make_sample("e1", 1.0, version=2),
        make_sample("e2", 0.0, version=7),
        make_sample("e3", 1.0, version=6),
    ]
    score = score_group(group, 7, **KW)
    assert score.stale == [True, False, False]
    assert score.status == "ok" and score.advantages[0] == 0.0
    assert score.advantages[1] == pytest.approx(-1.0, abs=1e-5)
    # only one fresh episode left: no baseline, the group is dropped
    assert score_group(group[:2], 7, **KW).status == "too_small"


def _loss(logp, behaviour, adv, off=None, **kw):
    logp = torch.tensor(logp, requires_grad=True)
    off = torch.zeros(len(adv), dtype=torch.bool) if off is None else torch.tensor(off)
    kw = {"clip_low": 0.2, "clip_high": 0.2, "is_cap": 2.0} | kw
    out = token_loss(logp, torch.tensor(behaviour), torch.tensor(adv), off, **kw)
    out.loss.sum().backward()
    return out, logp.grad


def test_loss_equals_hand_computed_value() -> None:
    out, grad = _loss([-1.0, -2.0], [-1.1, -1.5], [1.0, -1.0])
    r1 = math.exp(0.1)  # inside [0.8, 1.2]: unclipped
    # token 2: ratio exp(-0.5) = 0.61, A = -1: min(-0.61, -0.8) = -0.8, the clipped branch
    assert out.loss.tolist() == pytest.approx([-r1, 0.8], abs=1e-6)
    assert out.clipped.tolist() == [False, True]
    assert grad.tolist() == pytest.approx([-r1, 0.0], abs=1e-6)


def test_clipping_depends_on_advantage_sign() -> None:
    # ratio exp(0.5) = 1.65 > 1.2: with A > 0 clipped (no push further up), with A < 0 not clipped
    out, grad = _loss([-1.0, -1.0], [-1.5, -1.5], [1.0, -1.0])
    assert out.clipped.tolist() == [True, False]
    assert grad[0] == 0.0 and grad[1] == pytest.approx(math.exp(0.5), abs=1e-6)
    # the upper clip is configurable separately (clip-higher)
    out, _ = _loss([-1.0], [-1.5], [1.0], clip_high=1.0)
    assert out.clipped.tolist() == [False]


def test_off_policy_tokens_get_truncated_importance_weight() -> None:
    # behaviour -2, current -1: weight exp(1) = 2.72 truncated to 2; ratio to the proximal policy is 1
    out, grad = _loss([-1.0, -1.0], [-2.0, -0.5], [1.0, 1.0], off=[True, True])
    assert out.is_weight.tolist() == pytest.approx([2.0, math.exp(-0.5)], abs=1e-6)
    assert grad.tolist() == pytest.approx([-2.0, -math.exp(-0.5)], abs=1e-6)


def test_unknown_behaviour_logprob_is_on_policy() -> None:
    out, grad = _loss([-3.0], [float("nan")], [0.5], off=[True])
    assert out.is_weight.tolist() == [1.0] and out.loss.tolist() == pytest.approx([-0.5])
    assert grad.tolist() == pytest.approx([-0.5])


def test_k3_kl_to_reference() -> None:
    out, _ = _loss([-2.0, -1.0], [-2.0, -1.0], [0.0, 0.0], ref_logp=torch.tensor([-1.0, -1.0]), kl_coef=0.1)
    assert out.kl.tolist() == pytest.approx([math.e - 2, 0.0], abs=1e-6)
    assert out.loss.tolist() == pytest.approx([0.1 * (math.e - 2), 0.0], abs=1e-6)


def test_check_sample_reasons() -> None:
    ok = make_sample("e1", 1.0)
    assert check_sample(ok, "tiny", 50) is None
    assert check_sample(ok, "other", 50).startswith("subject:")
    assert check_sample(ok, "tiny", 10).startswith("schema:")  # token ids beyond the vocabulary
    no_gen = make_sample("e2", 1.0, gen=0)
    assert check_sample(no_gen, "tiny", 50).startswith("empty:")
    assert check_sample(make_sample("e3", 1.0, index=2, n_samples=2), "tiny", 50).startswith("schema:")


def test_a_nonfinite_reward_drops_the_group_instead_of_training_on_nan() -> None:
    # Rewards [1, 0, nan, 1] used to give every sample a NaN advantage with status `ok`.
    group = [make_sample(f"e{i}", r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    # the schema refuses it; a sample built past validation must still not train
    group[2] = group[2].model_copy(update={"reward": math.nan})
    score = score_group(group, 0, **KW)
    assert score.status == "nonfinite" and score.advantages == [0.0] * 4
