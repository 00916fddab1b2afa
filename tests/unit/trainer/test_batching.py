import math

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
    assert sorted(plan_rows([5, 3, 1], max_tokens=4)) == [[0], [1, 2]]  # too long for a row: its own


def test_packing_preserves_tokens_masks_and_shifts_targets() -> None:
    items = _items()
    by_id = {it.sample.sample_id: it for it in items}
    mbs = pack(items, max_tokens=16)
    assert sum(len(mb.sample_ids) for mb in mbs) == len(items)
    for mb in mbs:
        assert mb.tokens <= 16
        # packed: each sample a segment of its own, attending to nothing before it
        assert all(seg.ancestors.numel() == 0 for seg in mb.segments)
        offset = 0
        for path, sid in zip(mb.paths, mb.sample_ids, strict=True):
            s, adv = by_id[sid].sample, by_id[sid].advantage
            n = len(s.token_ids)
            assert path == list(range(offset, offset + n))  # side by side, nothing shared
            assert mb.input_ids[0, path].tolist() == s.token_ids
            assert mb.position_ids[0, path].tolist() == list(range(n))
            # position i predicts token i+1 of the same sample, for every generated token
            trained = [j for j in range(1, n) if s.loss_mask[j] == 1]
            rows = [k for k, p in enumerate(mb.pred_pos.tolist()) if offset <= p < offset + n]
            assert [mb.pred_pos[k].item() for k in rows] == [offset + j - 1 for j in trained]
            assert [mb.targets[k].item() for k in rows] == [s.token_ids[j] for j in trained]
            assert [mb.behaviour[k].item() for k in rows] == [s.logprobs[j] for j in trained]
            assert [mb.versions[k].item() for k in rows] == [s.policy_versions[j] for j in trained]
            assert [mb.advantages[k].item() for k in rows] == [adv] * len(trained)
            offset += n
    total_trained = sum(sum(it.sample.loss_mask[1:]) for it in items)
    assert sum(mb.trained_tokens for mb in mbs) == total_trained


def test_nan_behaviour_survives_packing() -> None:
    # The wire refuses NaN logprobs; one built in-process (past validation) stays "unknown" = on-policy.
    s = make_sample("e1", 0.0)
    s = s.model_copy(update={"logprobs": s.logprobs[:4] + [float("nan")] * 4})
    (mb,) = pack([Scored(s, 1.0)], max_tokens=64)
    assert torch.isnan(mb.behaviour).all()
    assert math.isnan(s.logprobs[-1])


def test_truncate_keeps_the_head() -> None:
    s = make_sample("e1", 0.0, prompt=5, gen=10)
    t = truncate(s, 8)
    assert t.token_ids == s.token_ids[:8] and t.loss_mask == [0] * 5 + [1] * 3
    assert len(t.logprobs) == len(t.policy_versions) == 8
    assert truncate(s, 100) is s
