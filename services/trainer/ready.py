"""Formed groups waiting for a step (pure logic): scored at the current version, taken as a batch,
whose step is reported as a `TrainStep`.

A group is scored when it forms and again when a step takes it: its samples too stale, or generated
by a version a rollback threw away, leave it, and a group left without a learning signal or too small
is dropped whole. A step takes up to `batch_groups` groups, and waits while fewer than
`min_batch_groups` (0: `batch_groups`) are trainable, or fewer than `batch_groups` for `batch_wait_s`.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from swarmrl.schemas import Sample, TrainStep
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.grouping import Group, Held
from swarmrl.services.trainer.grpo import GroupScore, score_group, staleness


@dataclass
class Batch:
    """The groups of one step, each with its score at the step's version."""

    groups: list[Group]
    scores: list[GroupScore]

    def items(self) -> list[Scored]:
        """Every sample with its advantage: what the learner trains."""
        return [
            Scored(h.sample, a)
            for g, s in zip(self.groups, self.scores, strict=True)
            for h, a in zip(g.items, s.advantages, strict=True)
        ]

    def held(self) -> list[Held]:
        return [h for g in self.groups for h in g.items]

    def handles(self, skipped: Container[str] = ()) -> list[Any]:
        """What the step acks once checkpointed: its samples but `skipped` ones, and its lost records."""
        samples = [h.handle for h in self.held() if h.sample.sample_id not in skipped]
        return [*samples, *(m for g in self.groups for m in g.lost)]


def task_metrics(samples: list[Sample]) -> dict[str, float]:
    """`reward_mean.<task>` and `samples.<task>` for each task named in a step's samples."""
    by_task: dict[str, list[float]] = {}
    for s in samples:
        if s.task:
            by_task.setdefault(s.task, []).append(s.reward)
    out: dict[str, float] = {}
    for task, rewards in sorted(by_task.items()):
        out[f"reward_mean.{task}"] = statistics.mean(rewards)
        out[f"samples.{task}"] = float(len(rewards))
    return out


def train_step(
    state: TrainerState,
    items: list[Scored],
    version: int,
    stats: dict[str, float],
    *,
    wall_s: float,
    dropped: dict[str, str],
    gauges: dict[str, float],
) -> TrainStep:
    """The record of step `state.step`, which trained `items` at policy `version`; `gauges` go to
    `extra` with the learner's other `stats` and the per-task rewards."""
    samples = [it.sample for it in items]
    rewards = [s.reward for s in samples]
    # Exact arithmetic: a float sum of huge finite rewards overflows, and a TrainStep refuses inf.
    mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
    stale = [staleness(s, version) for s in samples]
    extra = {k: float(v) for k, v in stats.items() if k not in ("loss", "tokens", "trained_tokens")}
    extra.update(gauges)
    extra.update(task_metrics(samples))
    return TrainStep(
        model=state.model, step=state.step, policy_version=state.version, loss=stats["loss"],
        reward_mean=mean, reward_std=std,
        samples=len(items), tokens=int(stats["tokens"]), trained_tokens=int(stats["trained_tokens"]),
        tokens_per_s=stats["tokens"] / max(stats["update_s"], 1e-9),
        staleness_mean=sum(stale) / len(stale), staleness_max=max(stale), wall_s=wall_s, extra=extra,
        sample_ids=[s.sample_id for s in samples], dropped=dropped,
    )  # fmt: skip


class ReadyGroups:
    def __init__(
        self,
        cfg: TrainerConfig,
        counts: Counter[str],
        drop: Callable[[list[Held], str], None],
        spend: Callable[[list[Any]], None],
        dropped_group: Callable[[Group, list[Held], str], None] = lambda group, items, reason: None,
    ) -> None:
        self.cfg = cfg
        self.counts = counts
        self.drop = drop  # takes samples that will not be trained, with the reason
        self.spend = spend  # takes the handles of lost-episode records no group will use
        self.dropped_group = dropped_group  # told of each group dropped whole: its samples as formed, and why
        self.groups: deque[Group] = deque()
        self.thrown_away: list[tuple[int, int]] = []
        """(good, served) of each rollback: samples of the versions strictly between carry the collapse
        it undid, and are dropped. Not kept across a restart."""
        self.short_since: float | None = None
        """Since when a free trainer has held `min_batch_groups` groups or more, but not `batch_groups`."""

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: Group, version: int) -> None:
        if self.score(group, version) is not None:
            self.groups.append(group)

    def rolled_back(self, good: int, served: int) -> None:
        self.thrown_away.append((good, served))

    def take(self, version: int, now: float) -> Batch | None:
        """Up to `batch_groups` groups re-scored at `version`, or None while too few are trainable."""
        cfg = self.cfg
        need = cfg.min_batch_groups or cfg.batch_groups
        taken: list[tuple[Group, GroupScore]] = []
        while self.groups and len(taken) < cfg.batch_groups:
            group = self.groups.popleft()
            if (score := self.score(group, version)) is not None:
                taken.append((group, score))
        if len(taken) < need:
            self.short_since = None
        elif len(taken) < cfg.batch_groups and cfg.batch_wait_s > 0:
            self.short_since = now if self.short_since is None else self.short_since
            if now - self.short_since < cfg.batch_wait_s:
                need = cfg.batch_groups
        if len(taken) < need:
            self.groups.extendleft(g for g, _ in reversed(taken))
            return None
        self.short_since = None
        return Batch([g for g, _ in taken], [s for _, s in taken])

    def score(self, group: Group, version: int) -> GroupScore | None:
        """Score `group` at `version`, dropping its stale samples and those of versions a rollback
        threw away; None when the whole group is dropped."""
        formed = list(group.items)
        gone = [self._thrown_away(h.sample) for h in group.items] if self.thrown_away else []
        if any(gone):
            self._remove(group, gone, "rolled_back")
        score = self._score(group, version)
        stale_left = any(score.stale)
        if stale_left:
            self._remove(group, score.stale, "stale")
            score = self._score(group, version)
        if score.status == "ok":
            return score
        self.counts[f"{score.status}_groups"] += 1
        reason = "stale" if stale_left and score.status == "too_small" else score.status
        self.dropped_group(group, formed, "rolled_back" if any(gone) and not group.items else reason)
        self.drop(group.items, score.status)
        self.spend(group.lost)
        return None

    def _remove(self, group: Group, which: list[bool], reason: str) -> None:
        """Drop the samples of `group` marked in `which`, counted as `dropped_<reason>`."""
        self.counts[f"dropped_{reason}"] += sum(which)
        self.drop([h for h, out in zip(group.items, which, strict=True) if out], reason)
        group.items = [h for h, out in zip(group.items, which, strict=True) if not out]

    def _thrown_away(self, sample: Sample) -> bool:
        return any(good < v < served for v in sample.policy_versions for good, served in self.thrown_away)

    def _score(self, group: Group, version: int) -> GroupScore:
        cfg = self.cfg
        return score_group(
            [h.sample for h in group.items], version, max_staleness=cfg.max_staleness,
            min_group_size=cfg.min_group_size, per_episode_norm=cfg.per_episode_norm,
            skip_zero_adv=cfg.skip_zero_adv_groups,
        )  # fmt: skip
