"""Segment-by-segment tree attention against dense attention with the [L, L] mask it stands for, and a
model run through it against the same model's own attention on each sample alone."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from swarmrl.schemas import Sample
from swarmrl.services.trainer.batching import Scored, pack_shared
from swarmrl.services.trainer.tree_attention import (
    DENSE_MAX_TOKENS,
    TREE_ATTENTION,
    Segment,
    dense_mask,
    tree_attention,
    tree_for,
)


def _tree() -> list[Segment]:
    """A 20-token row: a 6-token prompt, two answers below it, a third branching off the first answer."""
    t = torch.tensor
    return [Segment(0, 6, t([], dtype=torch.long)), Segment(6, 10, t([0, 1, 2, 3, 4, 5])),
            Segment(10, 15, t([0, 1, 2, 3, 4, 5])), Segment(15, 18, t([0, 1, 2, 3, 4, 5, 6, 7])),
            Segment(18, 20, t([], dtype=torch.long))]  # fmt: skip


def test_segments_attend_exactly_as_the_dense_mask_forward_and_backward() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 20, 8, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 20, 8, generator=gen, requires_grad=True)  # grouped-query: 2 kv heads for 4
    v = torch.randn(1, 2, 20, 8, generator=gen, requires_grad=True)
    out, _ = tree_attention(torch.nn.Module(), q, k, v, None, scaling=0.3, tree=_tree())
    mask = dense_mask(_tree(), 20)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad((out * torch.arange(8.0)).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * torch.arange(8.0)).sum(), (q, k, v))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    # the mask: a branch sees its ancestors and itself, never a sibling
    assert mask[12].nonzero().squeeze(-1).tolist() == [0, 1, 2, 3, 4, 5, 10, 11, 12]
    assert mask[16].nonzero().squeeze(-1).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 15, 16]


def test_a_short_rows_dense_mask_attends_as_its_segments_forward_and_backward() -> None:
    """`tree_for` hands a short row's attention its dense mask: one masked attention, the same
    outputs and gradients as segment by segment."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 6, 20, 8, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 20, 8, generator=gen, requires_grad=True)  # 3 query heads per kv head
    v = torch.randn(1, 2, 20, 8, generator=gen, requires_grad=True)
    dense = tree_for(_tree(), 20, "cpu")
    assert isinstance(dense, torch.Tensor) and dense.shape == (20, 20)
    assert isinstance(tree_for(_tree(), DENSE_MAX_TOKENS + 1, "cpu"), list)  # long rows: segments
    out, _ = tree_attention(torch.nn.Module(), q, k, v, None, scaling=0.3, tree=dense)
    ref, _ = tree_attention(torch.nn.Module(), q, k, v, None, scaling=0.3, tree=_tree())
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad((out * torch.arange(8.0)).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * torch.arange(8.0)).sum(), (q, k, v))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_segments_must_cover_the_row() -> None:
    q = torch.randn(1, 2, 8, 4)
    try:
        tree_attention(
            torch.nn.Module(), q, q, q, None, tree=[Segment(0, 5, torch.zeros(0, dtype=torch.long))]
        )
    except ValueError as exc:
        assert "cover 5 of the row's 8" in str(exc)
    else:
        raise AssertionError("a row the segments do not cover was attended")


def test_a_tree_row_gives_each_sample_the_logits_it_has_alone(tiny_model_dir: Path) -> None:
    """Through the model: the tree row's logits at each sample's positions equal those of the model's
    own (sdpa) attention on that sample alone."""
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    tree = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=TREE_ATTENTION).eval()
    prompt = [5, 9, 33, 40, 41, 42, 43]
    answers = [[100, 101, 102], [100, 101, 7, 8], [200, 3], [100, 101, 102, 9]]
    items = [
        Scored(Sample(sample_id=f"s{i}", episode_id="e", agent="a", model="m", task_id="t", group_key="g",
                      token_ids=prompt + a,
                      loss_mask=[0] * len(prompt) + [1] * len(a), logprobs=[0.0] * (len(prompt) + len(a)),
                      policy_versions=[0] * (len(prompt) + len(a)), reward=0.0), 1.0)
        for i, a in enumerate(answers)
    ]  # fmt: skip
    (mb,) = pack_shared(items, max_tokens=64)
    assert mb.tokens < sum(len(it.sample.token_ids) for it in items)  # the prefix was shared
    with torch.no_grad():
        row = tree(input_ids=mb.input_ids, position_ids=mb.position_ids, tree=mb.segments, use_cache=False)
        by_id = {it.sample.sample_id: it.sample for it in items}
        for sid, path in zip(mb.sample_ids, mb.paths, strict=True):
            alone = plain(input_ids=torch.tensor([by_id[sid].token_ids])).logits[0]
            torch.testing.assert_close(row.logits[0, path], alone, atol=1e-5, rtol=1e-5)
