"""Sequence packing (pure torch): scored samples in, micro-batches out, one row of at most
`max_tokens` computed tokens each (a longer sample gets a row of its own), never padded.

- `pack`: samples side by side (first-fit decreasing); each is a segment without ancestors, its
  position ids restarting at 0, so packed samples never attend to each other.
- `pack_shared`: samples in token order, each adding only the tokens past its common prefix with the
  previous one: the row is the prefix tree of its samples, a token's position id its depth, attending
  to its ancestors only (`tree_attention.py`). A shared prefix is computed once; loss and gradients
  equal the packed layout's (`tests/unit/trainer/test_prefix_sharing.py`).

Targets are per trained token: logits at row position `pred_pos[k]` predict `targets[k]`, since in a
tree one position predicts a different token for each branch below it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarmrl.schemas import Sample
from swarmrl.services.trainer.tree_attention import Segment


@dataclass(frozen=True)
class Scored:
    """A sample with its GRPO advantage."""

    sample: Sample
    advantage: float


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [1, L] token ids of the row
    position_ids: torch.Tensor  # [1, L] each token's index in its sample (its depth in the prefix tree)
    segments: list[Segment]  # per sample: the positions it adds and the shared prefix they attend to
    pred_pos: torch.Tensor  # [T] per trained token: the row position whose logits predict it
    targets: torch.Tensor  # [T] the trained token ids
    behaviour: torch.Tensor  # [T] behaviour logprob of each trained token (NaN = unknown)
    versions: torch.Tensor  # [T] policy version that generated each trained token
    advantages: torch.Tensor  # [T] advantage of the sample each trained token belongs to
    paths: list[list[int]]  # per sample, the row position of each of its tokens
    sample_ids: list[str]
    sample_tokens: int = 0  # sum of the samples' lengths: what a layout without sharing computes

    @property
    def tokens(self) -> int:
        """Tokens computed by the forward pass (the row length)."""
        return int(self.input_ids.shape[1])

    @property
    def trained_tokens(self) -> int:
        return int(self.pred_pos.numel())


def truncate(sample: Sample, max_tokens: int) -> Sample:
    """Cut a sample to its first `max_tokens` tokens (causal: earlier logprobs are unchanged)."""
    if len(sample.token_ids) <= max_tokens:
        return sample
    return sample.model_copy(
        update={
            name: getattr(sample, name)[:max_tokens]
            for name in ("token_ids", "loss_mask", "logprobs", "policy_versions")
        }
    )


def plan_rows(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: indices of `lengths` in rows of at most `max_tokens` tokens."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(max_tokens - lengths[i])
    return rows


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def plan_shared_rows(token_ids: list[list[int]], max_tokens: int) -> list[list[tuple[int, int]]]:
    """Rows of (sample index, tokens shared with the row's previous sample), in token order: in
    lexicographic order the previous sample shares the longest prefix of all before it."""
    rows: list[list[tuple[int, int]]] = []
    used = 0
    prev: list[int] = []
    for i in sorted(range(len(token_ids)), key=lambda i: token_ids[i]):
        ids = token_ids[i]
        shared = common_prefix(prev, ids)
        if not rows or used + len(ids) - shared > max_tokens:
            rows.append([])
            used, shared = 0, 0
        rows[-1].append((i, shared))
        used += len(ids) - shared
        prev = ids
    return rows


def pack(items: list[Scored], max_tokens: int) -> list[MicroBatch]:
    rows = plan_rows([len(it.sample.token_ids) for it in items], max_tokens)
    return [_row([(items[i], 0) for i in row]) for row in rows]


def pack_shared(items: list[Scored], max_tokens: int) -> list[MicroBatch]:
    rows = plan_shared_rows([it.sample.token_ids for it in items], max_tokens)
    return [_row([(items[i], shared) for i, shared in row]) for row in rows]


def _row(items: list[tuple[Scored, int]]) -> MicroBatch:
    """One row from (item, tokens shared with the previous item)."""
    ids: list[int] = []
    pos: list[int] = []
    paths: list[list[int]] = []
    pred: list[int] = []
    targets: list[int] = []
    behaviour: list[float] = []
    versions: list[int] = []
    adv: list[float] = []
    segments: list[Segment] = []
    for it, shared in items:
        s = it.sample
        n = len(s.token_ids)
        path = (paths[-1][:shared] if shared else []) + list(range(len(ids), len(ids) + n - shared))
        paths.append(path)
        if n > shared:  # a sample already whole in the row adds no segment
            segments.append(
                Segment(len(ids), len(ids) + n - shared, torch.tensor(path[:shared], dtype=torch.long))
            )
        ids += s.token_ids[shared:]
        pos += range(shared, n)
        for j in range(1, n):  # position j-1 predicts token j of the same sample
            if s.loss_mask[j] == 1:
                pred.append(path[j - 1])
                targets.append(s.token_ids[j])
                behaviour.append(s.logprobs[j])
                versions.append(s.policy_versions[j])
                adv.append(it.advantage)
    return MicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        segments=segments,
        pred_pos=torch.tensor(pred, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        behaviour=torch.tensor(behaviour, dtype=torch.float32),
        versions=torch.tensor(versions, dtype=torch.long),
        advantages=torch.tensor(adv, dtype=torch.float32),
        paths=paths,
        sample_ids=[it.sample.sample_id for it, _ in items],
        sample_tokens=sum(len(it.sample.token_ids) for it, _ in items),
    )


def shard(items: list[Scored], n: int, rank: int, by_prefix: bool) -> list[Scored]:
    """Process `rank`'s share of a step among `n`, balanced by tokens. `by_prefix`: a run of the
    samples in token order, cut where neighbours share least (within a quarter share of the even
    split), so a group stays on one process; else dealt round-robin by length."""
    if not by_prefix:
        return sorted(items, key=lambda it: -len(it.sample.token_ids))[rank::n]
    ordered = sorted(items, key=lambda it: it.sample.token_ids)
    ends = [0]  # ends[i]: tokens of ordered[:i]
    for it in ordered:
        ends.append(ends[-1] + len(it.sample.token_ids))
    total, cuts = ends[-1], [0]
    for k in range(1, n):
        ideal, slack = k * total / n, total / n / 4
        window = [i for i in range(cuts[-1], len(ordered) + 1) if abs(ends[i] - ideal) <= slack]
        window = window or [min(range(cuts[-1], len(ordered) + 1), key=lambda i: abs(ends[i] - ideal))]
        cuts.append(min(window, key=lambda i: (_shared_at(ordered, i), abs(ends[i] - ideal))))
    cuts.append(len(ordered))
    return ordered[cuts[rank] : cuts[rank + 1]]


def _shared_at(ordered: list[Scored], i: int) -> int:
    """Tokens a cut before `ordered[i]` would stop sharing."""
    if i <= 0 or i >= len(ordered):
        return 0
    return common_prefix(ordered[i - 1].sample.token_ids, ordered[i].sample.token_ids)


def empty_micro_batch() -> MicroBatch:
    """One token, nothing trained: keeps a process with a short shard in step with the others."""
    return MicroBatch(
        input_ids=torch.zeros((1, 1), dtype=torch.long),
        position_ids=torch.zeros((1, 1), dtype=torch.long),
        segments=[Segment(0, 1, torch.zeros(0, dtype=torch.long))],
        pred_pos=torch.zeros(0, dtype=torch.long),
        targets=torch.zeros(0, dtype=torch.long),
        behaviour=torch.zeros(0),
        versions=torch.zeros(0, dtype=torch.long),
        advantages=torch.zeros(0),
        paths=[],
        sample_ids=[],
    )
