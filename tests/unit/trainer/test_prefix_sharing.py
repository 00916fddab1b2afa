"""Prefix-shared rows compute shared prefixes once, and change nothing else: the loss and every
gradient equal the packed (unshared) layout's on the project's tiny model, for several tree shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmrl.schemas import Sample
from swarmrl.services.trainer.batching import Scored, pack, pack_shared, plan_shared_rows, shard
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import Learner
from swarmrl.services.trainer.tree_attention import dense_mask
from tests.unit.trainer.samples import make_sample

VOCAB = 500


def _sample(sid: str, ids: list[int], trained_from: int, version: int = 0, logprob: float = -1.0) -> Sample:
    """A sample whose tokens from `trained_from` on were generated (loss_mask 1)."""
    n = len(ids)
    base = make_sample(sid, 1.0, prompt=1, gen=1)
    return base.model_copy(
        update={
            "sample_id": sid,
            "token_ids": ids,
            "loss_mask": [0] * trained_from + [1] * (n - trained_from),
            "logprobs": [0.0] * trained_from + [logprob] * (n - trained_from),
            "policy_versions": [-1] * trained_from + [version] * (n - trained_from),
        }
    )


def _rand(rng: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=rng).tolist()


def _group(rng: torch.Generator, tag: str = "g") -> list[Scored]:
    """A GRPO group: one 20-token prompt, four different 6-9 token answers."""
    prompt = _rand(rng, 20)
    return [
        Scored(_sample(f"{tag}{i}", prompt + _rand(rng, 6 + i), 20), adv)
        for i, adv in enumerate([1.0, -0.5, 0.25, -0.75])
    ]


def _identical(rng: torch.Generator) -> list[Scored]:
    """Two samples with the same tokens (a tiny model often answers alike) and a third branching off."""
    ids = _rand(rng, 18)
    return [
        Scored(_sample("same0", ids, 12), 1.0),
        Scored(_sample("same1", ids, 12), -1.0),
        Scored(_sample("other", ids[:15] + _rand(rng, 5), 12), 0.5),
    ]


def _nested(rng: torch.Generator) -> list[Scored]:
    """Three levels: a system prompt, two questions under it, two answers under each; plus one sample
    that is a strict prefix of another, with generated (trained) tokens inside the shared prefix, as
    the timelines of one episode have."""
    system = _rand(rng, 10)
    q1, q2 = system + _rand(rng, 5), system + _rand(rng, 7)
    turn = q1 + _rand(rng, 4)
    return [
        Scored(_sample("q1a", q1 + _rand(rng, 6), 15), 1.0),
        Scored(_sample("q1b", q1 + _rand(rng, 3), 15), -1.0),
        Scored(_sample("q2a", q2 + _rand(rng, 5), 17), 0.3),
        Scored(_sample("q2b", q2 + _rand(rng, 8), 17), -0.3),
        Scored(_sample("turn1", turn, 15), 0.7),
        Scored(_sample("turn2", turn + _rand(rng, 6), 15), 0.7),
    ]


def _unrelated(rng: torch.Generator) -> list[Scored]:
    """Nothing shared (every first token differs): the tree is a forest of single paths."""
    return [Scored(_sample(f"u{i}", [10 + i] + _rand(rng, 9), 4), 0.5 - i / 3) for i in range(4)]


SHAPES = {"group": _group, "identical": _identical, "nested": _nested, "unrelated": _unrelated}


@pytest.fixture(scope="module")
def learner(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Learner:
    cfg = TrainerConfig(model_path=str(tiny_model_dir), run_dir=str(tmp_path_factory.mktemp("run")))
    return Learner(cfg, cfg.model_path)


def _loss_and_grads(learner: Learner, mbs: list, version: int) -> tuple[float, list[torch.Tensor]]:
    learner.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = dict.fromkeys(("loss", "tokens", "computed_tokens", "trained_tokens", "clipped",
                                            "kl", "off_tokens", "is_weight", "unknown_behaviour"), 0.0)  # fmt: skip
    total = sum(learner._micro_loss(mb, version, None, sums) for mb in mbs)
    total.backward()
    grads = [p.grad.detach().clone() for p in learner.model.parameters()]
    learner.optimizer.zero_grad(set_to_none=True)
    return float(total.detach()), grads


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shared_loss_and_gradients_equal_unshared(learner: Learner, shape: str) -> None:
    items = SHAPES[shape](torch.Generator().manual_seed(len(shape)))
    shared = pack_shared(items, max_tokens=512)
    apart = pack(items, max_tokens=512)
    assert len(shared) == 1 and sum(mb.trained_tokens for mb in shared) == sum(
        mb.trained_tokens for mb in apart
    )
    if shape != "unrelated":
        assert shared[0].tokens < sum(mb.tokens for mb in apart)  # something was shared
    loss_s, grads_s = _loss_and_grads(learner, shared, version=0)
    loss_a, grads_a = _loss_and_grads(learner, apart, version=0)
    assert loss_s == pytest.approx(loss_a, rel=1e-5, abs=1e-5)
    assert any(g.abs().sum() > 0 for g in grads_a)
    for gs, ga in zip(grads_s, grads_a, strict=True):
        torch.testing.assert_close(gs, ga, atol=2e-5, rtol=1e-4)


def test_shared_logprobs_equal_each_sample_alone(learner: Learner) -> None:
    items = _nested(torch.Generator().manual_seed(3))
    (mb,) = pack_shared(items, max_tokens=512)
    together = learner._logprobs(learner.model, mb)
    by_id = {it.sample.sample_id: it for it in items}
    alone = torch.cat([learner._logprobs(learner.model, pack([by_id[sid]], 512)[0]) for sid in mb.sample_ids])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_rows_hold_each_sample_once_and_respect_the_budget() -> None:
    rng = torch.Generator().manual_seed(0)
    items = _group(rng) + _group(rng, "h") + _nested(rng)
    mbs = pack_shared(items, max_tokens=48)
    assert sorted(sid for mb in mbs for sid in mb.sample_ids) == sorted(it.sample.sample_id for it in items)
    by_id = {it.sample.sample_id: it.sample for it in items}
    for mb in mbs:
        assert mb.tokens <= 48
        for path, sid in zip(mb.paths, mb.sample_ids, strict=True):
            s = by_id[sid]
            # every token sits at its path position, at its depth, and sees exactly its ancestors
            assert mb.input_ids[0, path].tolist() == s.token_ids
            assert mb.position_ids[0, path].tolist() == list(range(len(path)))
            last = dense_mask(mb.segments, mb.tokens)[path[-1]]
            assert last.nonzero().squeeze(-1).tolist() == sorted(path)
    assert sum(mb.sample_tokens for mb in mbs) == sum(len(it.sample.token_ids) for it in items)


def test_shared_rows_count_only_new_tokens() -> None:
    a, b, c = [1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 4]
    rows = plan_shared_rows([a, b, c], max_tokens=16)
    assert rows == [[(0, 0), (2, 4), (1, 2)]]  # sorted a, c, b: c adds nothing, b adds one token
    assert plan_shared_rows([a, b, c], max_tokens=4) == [[(0, 0), (2, 4)], [(1, 0)]]
    assert plan_shared_rows([a, b], max_tokens=3) == [[(0, 0)], [(1, 0)]]  # a alone: longer than a row


def test_a_step_trains_the_same_either_way(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two learners from the same weights, one sharing prefixes: the same step statistics (but fewer
    computed tokens) and the same weights after two steps."""
    rng = torch.Generator().manual_seed(5)
    items = _group(rng) + _nested(rng)
    learners = []
    for sharing in (False, True):
        cfg = TrainerConfig(model_path=str(tiny_model_dir), run_dir=str(tmp_path / str(sharing)),
                            lr=1e-3, prefix_sharing=sharing)  # fmt: skip
        learners.append(Learner(cfg, cfg.model_path))
    stats = [[lr.train_step(items, version=0).stats for _ in range(2)][-1] for lr in learners]
    for key in ("loss", "trained_tokens", "clip_frac", "tokens"):
        assert stats[1][key] == pytest.approx(stats[0][key], rel=1e-4, abs=1e-6), key
    assert stats[0]["computed_tokens"] == stats[0]["tokens"]  # packed: every sample token is computed
    assert stats[1]["computed_tokens"] < 0.6 * stats[0]["computed_tokens"]
    for pa, pb in zip(learners[0].model.parameters(), learners[1].model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-4)


def test_shards_keep_groups_whole_and_cover_every_sample() -> None:
    rng = torch.Generator().manual_seed(1)
    items = [it for tag in "abcdef" for it in _group(rng, tag)]  # six groups of four
    for n in (1, 2, 3):
        parts = [shard(items, n, rank, by_prefix=True) for rank in range(n)]
        assert sorted(it.sample.sample_id for p in parts for it in p) == sorted(
            it.sample.sample_id for it in items
        )
        for p in parts:  # whole groups, and as many per process
            tags = [it.sample.sample_id[0] for it in p]
            assert all(tags.count(t) == 4 for t in set(tags)), tags
            assert len(p) == 24 // n
    packed = [shard(items, 2, rank, by_prefix=False) for rank in range(2)]
    assert sorted(len(p) for p in packed) == [12, 12]
