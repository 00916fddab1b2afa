"""Formed groups waiting for a step (pure logic, no NATS): scored at the current version, taken as a
batch, whose step is reported as a `TrainStep`.

A group is scored when it forms and again when a step takes it (the policy may have moved on since):
its samples too stale for `max_staleness` leave it, and so do samples a version thrown away by a
rollback generated; a group left without a learning signal (all rewards equal) or too small is
dropped whole, its lost-episode records spent. A step takes up to `batch_groups` groups; while fewer
than `min_batch_groups` (0: `batch_groups`) are trainable, or fewer than `batch_groups` for less than
`batch_wait_s`, they stay queued.
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
        """What the step acks once it is checkpointed: its samples (less `skipped`, by sample id) and
        the lost-episode records its groups counted out."""
        samples = [h.handle for h in self.held() if h.sample.sample_id not in skipped]
        return [*samples, *(m for g in self.groups for m in g.lost)]


def task_metrics(samples: list[Sample]) -> dict[str, float]:
    """`reward_mean.<task>` and `samples.<task>` for each task named in a step's samples (cocktail
    training mixes tasks in one step). Samples without a task name count only in `reward_mean`."""
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
    """The record of step `state.step`, which trained `items` at policy `version` with the learner's
    `stats`, and reports `dropped` (sample id -> reason); `gauges` (counters, queue sizes) go to
    `extra` with the learner's other statistics and the per-task rewards."""
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
        self.drop = drop
        """Takes samples that will not be trained, with the reason."""
        self.spend = spend
        """Takes the handles of lost-episode records no group will use."""
        self.dropped_group = dropped_group
        """Told of each group dropped whole: its samples as formed, and why."""
        self.groups: deque[Group] = deque()
        self.thrown_away: list[tuple[int, int]] = []
        """(good, served) of each rollback: the versions strictly between were thrown away, and so are
        the samples they generated. Such samples carry the collapse the rollback undid: a restored
        policy trained on them falls again within seconds (bench/results/peers-20min-round10/dense.md).
        Not kept across a restart of the trainer."""
        self.short_since: float | None = None
        """When a free trainer first held `min_batch_groups` groups but fewer than `batch_groups`
        (`batch_wait_s`); None while it holds a full batch or too few."""

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: Group, version: int) -> None:
        if self.score(group, version) is not None:
            self.groups.append(group)

    def rolled_back(self, good: int, served: int) -> None:
        self.thrown_away.append((good, served))

    def take(self, version: int, now: float) -> Batch | None:
        """Up to `batch_groups` groups re-scored at `version`, or None while too few are trainable
        (module docstring)."""
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
        """Score `group` at `version`; drop its stale samples, those of versions a rollback threw
        away, or the whole group (None)."""
        formed = list(group.items)
        gone = [self._thrown_away(h.sample) for h in group.items] if self.thrown_away else []
        if any(gone):
            self.counts["dropped_rolled_back"] += sum(gone)
            self.drop([h for h, g in zip(group.items, gone, strict=True) if g], "rolled_back")
            group.items = [h for h, g in zip(group.items, gone, strict=True) if not g]
        score = self._score(group, version)
        stale_left = any(score.stale)
        if any(score.stale):
            stale = [h for h, st in zip(group.items, score.stale, strict=True) if st]
            self.counts["dropped_stale"] += len(stale)
            self.drop(stale, "stale")
            group.items = [h for h, st in zip(group.items, score.stale, strict=True) if not st]
            score = self._score(group, version)
        if score.status == "ok":
            return score
        self.counts[f"{score.status}_groups"] += 1
        reason = "stale" if stale_left and score.status == "too_small" else score.status
        self.dropped_group(group, formed, "rolled_back" if any(gone) and not group.items else reason)
        self.drop(group.items, score.status)
        self.spend(group.lost)
        return None

    def _thrown_away(self, sample: Sample) -> bool:
        return any(good < v < served for v in sample.policy_versions for good, served in self.thrown_away)

    def _score(self, group: Group, version: int) -> GroupScore:
        cfg = self.cfg
        return score_group(
            [h.sample for h in group.items], version, max_staleness=cfg.max_staleness,
            min_group_size=cfg.min_group_size, per_episode_norm=cfg.per_episode_norm,
            skip_zero_adv=cfg.skip_zero_adv_groups,
        )  # fmt: skip
