"""What a train step reports (pure logic, no NATS): the `TrainStep` record of one step."""

from __future__ import annotations

import statistics

from swarmrl.schemas import Sample, TrainStep
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState
from swarmrl.services.trainer.grpo import staleness


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
