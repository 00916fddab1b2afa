import math

import pytest
import torch

from swarmrl.services.trainer.batching import Scored, pack, plan_rows, truncate
from tests.unit.trainer.samples import make_sample


def _items() -> list[Scored]:
    lengths = [(3, 5), (10, 2), (2, 2), (6, 6), (1, 1)]
    return [
        Scored(make_sample(f"e{i}", 0.0, prompt=p, gen=g, version=i), float(i))
        for i, (p, g) in enumerate(lengths)
    ]


def test_first_fit_decreasing_respects_the_token_budget() -> None:
    rows = plan_rows([8, 12, 4, 12, 2], max_tokens=16)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3, 4]
    assert all(sum([8, 12, 4, 12, 2][i] for i in r) <= 16 for r in rows)
    assert len(rows) == 3  # 38 tokens need at least 3 rows of 16
    with pytest.raises(ValueError, match="exceed max_tokens=4"):
        plan_rows([5], max_tokens=4)


def test_packing_preserves_tokens_masks_and_shifts_targets() -> None:
    items = _items()
    by_id = {it.sample.sample_id: it for it in items}
    mbs = pack(items, max_tokens=16)
    assert sum(len(mb.sample_ids) for mb in mbs) == len(items)
    for mb in mbs:
        assert mb.tokens <= 16
        for (start, n), sid in zip(mb.spans, mb.sample_ids, strict=True):
            s, adv = by_id[sid].sample, by_id[sid].advantage
            end = start + n
            assert mb.input_ids[0, start:end].tolist() == s.token_ids
            assert mb.position_ids[0, start:end].tolist() == list(range(n))
            # position i predicts token i+1 of the same sample; the last position predicts nothing
            assert mb.targets[start : end - 1].tolist() == s.token_ids[1:]
            assert mb.mask[start:end].tolist() == [m == 1 for m in s.loss_mask[1:]] + [False]
            assert mb.behaviour[start : end - 1].tolist() == s.logprobs[1:]
            assert mb.versions[start : end - 1].tolist() == s.policy_versions[1:]
            assert mb.advantages[start:end].tolist() == [adv] * n
    total_trained = sum(sum(it.sample.loss_mask[1:]) for it in items)
    assert sum(mb.trained_tokens for mb in mbs) == total_trained


def test_nan_behaviour_survives_packing() -> None:
    # The wire refuses NaN logprobs; one built in-process (past validation) stays "unknown" = on-policy.
    s = make_sample("e1", 0.0)
    s = s.model_copy(update={"logprobs": s.logprobs[:4] + [float("nan")] * 4})
    (mb,) = pack([Scored(s, 1.0)], max_tokens=64)
    assert torch.isnan(mb.behaviour[mb.mask]).all()
    assert math.isnan(s.logprobs[-1])


def test_truncate_keeps_the_head() -> None:
    s = make_sample("e1", 0.0, prompt=5, gen=10)
    t = truncate(s, 8)
    assert t.token_ids == s.token_ids[:8] and t.loss_mask == [0] * 5 + [1] * 3
    assert len(t.logprobs) == len(t.policy_versions) == 8
    assert truncate(s, 100) is s
