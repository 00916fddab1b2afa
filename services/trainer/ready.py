"""Formed groups waiting for a step (pure logic): scored at the current version, taken as a batch,
whose step is reported as a `TrainStep`.

A group is scored when it forms and again when a step takes it: its samples too stale, or generated
by a version a rollback threw away, leave it, and a group left without a learning signal or too small
is dropped whole. A step takes up to `batch_groups` groups, and waits while fewer than
`min_batch_groups` (0: `batch_groups`) are trainable, or fewer than `batch_groups` for `batch_wait_s`.

What became of each group: one `GroupOutcome` per formed or dropped group and owner (`Outcomes`),
published on `swarm.metrics.outcome.<owner>.<model>` with a msg id of the group's episode ids (so a
replayed decision is stored once), and a warning, once per client, when most of its groups are dropped.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from swarmrl.schemas import OUTCOME_REASONS, GroupOutcome, Sample, TrainStep
from swarmrl.schemas import subjects as S
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.grouping import Group, Held
from swarmrl.services.trainer.grpo import GroupScore, score_group, staleness
from swarmrl.services.trainer.intake import Unacked


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
        unacked: Unacked,
        dropped_group: Callable[[Group, list[Held], str], None],
    ) -> None:
        self.cfg, self.counts, self.unacked = cfg, counts, unacked  # `unacked` takes what is not trained
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
        self.unacked.drop(group.items, score.status)
        self.unacked.spend(group.lost)
        return None

    def _remove(self, group: Group, which: list[bool], reason: str) -> None:
        """Drop the samples of `group` marked in `which`, counted as `dropped_<reason>`."""
        self.counts[f"dropped_{reason}"] += sum(which)
        self.unacked.drop([h for h, out in zip(group.items, which, strict=True) if out], reason)
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


def msg_id(prefix: str, ids: Iterable[str]) -> str:
    """`<prefix>-<digest of the sorted ids>`: the same record published again is stored once."""
    digest = hashlib.sha1("\n".join(sorted(ids)).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


WARN_AFTER_GROUPS = 8
"""A client's outcomes counted before the trainer judges whether most of its groups are dropped."""


class Outcomes:
    def __init__(self, model: str) -> None:
        self.model = model
        self.pending: list[tuple[str, GroupOutcome, str]] = []  # (subject, record, msg id) not yet published
        self.by_client: dict[str, Counter[str]] = {}
        """client id -> how many of its groups were trained, and dropped per reason."""
        self.warned: set[str] = set()

    def trained(self, key: str, items: list[Held], step: int) -> None:
        self._add(key, items, "trained", "", step)

    def dropped(self, key: str, items: list[Held], reason: str, step: int) -> None:
        if items:
            self._add(key, items, "dropped", reason, step)

    def take(self) -> list[tuple[str, GroupOutcome, str]]:
        pending, self.pending = self.pending, []
        return pending

    def warnings(self) -> list[str]:
        """For each client not warned yet with `WARN_AFTER_GROUPS` outcomes, most of them drops: why."""
        out = []
        for client, counts in self.by_client.items():
            total = sum(counts.values())
            dropped = total - counts["trained"]
            if client in self.warned or total < WARN_AFTER_GROUPS or dropped * 2 <= total:
                continue
            self.warned.add(client)
            reason, n = Counter({r: c for r, c in counts.items() if r != "trained"}).most_common(1)[0]
            out.append(
                f"{dropped} of the {total} groups of client {client!r} were dropped untrained, {n} of them "
                f"{reason}: {OUTCOME_REASONS.get(reason, reason)} "
                "(`SwarmClient.outcome`, the ledger's `groups`)"
            )
        return out

    def _add(self, key: str, items: list[Held], outcome: str, reason: str, step: int) -> None:
        by_owner: dict[str, list[Held]] = {}
        for h in items:
            try:
                by_owner.setdefault(S.episode_owner(h.sample.episode_id), []).append(h)
            except ValueError:  # an episode id of no owner (a service's): nobody to tell
                continue
        for owner, held in by_owner.items():
            samples = [h.sample for h in held]
            try:
                std = statistics.pstdev([s.reward for s in samples])
            except OverflowError:
                std = math.inf
            episodes = sorted({s.episode_id for s in samples})
            record = GroupOutcome(
                model=self.model, owner=owner, group_key=key, task=samples[0].task,
                client_id=samples[0].client_id, outcome=outcome, reason=reason,  # type: ignore[arg-type]
                step=step, reward_std=std if math.isfinite(std) else 0.0, episodes=len(episodes),
            )  # fmt: skip
            self.pending.append(
                (S.outcome_subject(owner, self.model), record, msg_id(f"outcome-{self.model}", episodes))
            )
            self.by_client.setdefault(record.client_id, Counter())[reason or "trained"] += 1
