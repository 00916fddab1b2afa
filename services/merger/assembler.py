"""One finished episode → its training samples and merge statistics (pure logic, no NATS).

Consumes the episode's `BeginEvent`, its `LlmEvent`s in stream order and its `RewardEvent`s.
Produces one `Sample` per surviving timeline (see `timelines.py`) and one `MergeStats`.

- sample_id = `<episode_id>.<agent>.<model>.<index>` (`sample_id()`): index counts the samples of
  one (agent, model) in call order, and n_samples is their count. A trainer sees only its own
  model's samples and waits for n_samples of each agent, so an agent that calls two models completes
  in both trainers. The id is unique across the episode's models (episode ids and model names hold
  no dots, so it parses from both ends even when an agent name does), and it depends only on the
  events in stream order: a replay yields the same ids and JetStream's duplicate window drops the
  republished copies.
- task = the begin event's `task["name"]` when it is a string, else "" (`task_name()`): lets the
  trainer report rewards per task when tasks are mixed (cocktail training).
- reward of an agent's samples = sum of the reward events for that agent plus the team rewards
  (events whose `agent` is empty).
- group_key is the begin event's resolved group (`group_key`, or `task_id` when empty), so the
  trainer never has to know the fallback.
- Eval episodes are recorded, never trained on: no samples, and MergeStats with status `merged`,
  `timelines_kept` 0, `tokens_after` 0 and reason `eval`, so that counts over MergeStats add up to
  what reached SAMPLES while tokens_before still shows what the eval cost.
- An ended episode without LLM calls gets status `empty`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from swarmrl.schemas import BeginEvent, LlmEvent, LostEpisode, MergeStats, RewardEvent, Sample
from swarmrl.services.merger.timelines import MergeOptions, Timeline, merge_timelines

EVAL_REASON = "eval"


def agent_rewards(rewards: list[RewardEvent], agents: set[str]) -> dict[str, float]:
    team = sum(r.value for r in rewards if not r.agent)
    own: dict[str, float] = defaultdict(float)
    for r in rewards:
        if r.agent:
            own[r.agent] += r.value
    return {a: team + own[a] for a in agents}


def sample_id(episode_id: str, agent: str, model: str, index: int) -> str:
    return f"{episode_id}.{agent}.{model}.{index}"


def task_name(begin: BeginEvent) -> str:
    name = begin.task.get("name")
    return name if isinstance(name, str) else ""


def _identity(begin: BeginEvent | None) -> dict[str, Any]:
    """The group, models and eval flag every MergeStats carries (empty when begin is unknown)."""
    if begin is None:
        return {}
    return {"group_key": begin.group, "models": list(begin.models), "eval": begin.eval}


def dropped_stats(
    episode_id: str,
    calls: list[LlmEvent],
    status: Literal["aborted", "timeout"],
    reason: str,
    begin: BeginEvent | None = None,
) -> MergeStats:
    """Stats of an episode dropped without samples: what it cost, and why it was dropped."""
    return MergeStats(
        episode_id=episode_id,
        **_identity(begin),
        status=status,
        agents=len({c.agent for c in calls}),
        calls=len(calls),
        tokens_before=sum(len(c.prompt_ids) + len(c.output_ids) for c in calls),
        trained_tokens_before=sum(len(c.output_ids) for c in calls),
        reason=reason,
    )


def assemble(
    begin: BeginEvent,
    calls: list[LlmEvent],
    rewards: list[RewardEvent],
    opts: MergeOptions = MergeOptions(),
) -> tuple[list[Sample], MergeStats]:
    """Merge an ended episode's calls into samples; `calls` must be in stream order."""
    initial = [Timeline.from_call(c, i) for i, c in enumerate(calls)]
    kept = [] if begin.eval else merge_timelines(initial, opts)

    by_role: dict[tuple[str, str], list[Timeline]] = defaultdict(list)
    for t in kept:  # already in call order
        by_role[t.agent, t.model].append(t)
    reward = agent_rewards(rewards, {agent for agent, _ in by_role})
    task = task_name(begin)
    samples = []
    for (agent, model), timelines in by_role.items():
        for index, t in enumerate(timelines):
            samples.append(
                Sample(
                    sample_id=sample_id(begin.episode_id, agent, model, index),
                    model=model,
                    episode_id=begin.episode_id,
                    agent=agent,
                    task_id=begin.task_id,
                    group_key=begin.group,
                    group_size=begin.group_size,
                    task=task,
                    client_id=begin.client_id,
                    client_version=begin.client_version,
                    token_ids=t.tokens,
                    loss_mask=t.loss_mask,
                    logprobs=t.logprobs,
                    policy_versions=t.policy_versions,
                    reward=reward[agent],
                    index=index,
                    n_samples=len(timelines),
                    n_calls=t.n_calls,
                )
            )

    stats = MergeStats(
        episode_id=begin.episode_id,
        **_identity(begin),
        status="merged" if calls else "empty",
        agents=len({c.agent for c in calls}),
        calls=len(calls),
        timelines_kept=len(samples),
        tokens_before=sum(len(t.tokens) for t in initial),
        tokens_after=sum(len(s.token_ids) for s in samples),
        trained_tokens_before=sum(t.trained_tokens for t in initial),
        trained_tokens_after=sum(sum(s.loss_mask) for s in samples),
        reason=EVAL_REASON if begin.eval else "",
        sample_models=sorted({s.model for s in samples}),
    )
    return samples, stats


def lost_episodes(stats: MergeStats) -> list[LostEpisode]:
    """One record per trainable model of a training episode that sends that model no sample (the
    episode was dropped, or the model's role never acted): its trainer counts the episode out of
    its group instead of waiting for it until the group timeout."""
    if stats.eval:
        return []
    sent = set(stats.sample_models or []) if stats.status == "merged" else set()
    return [
        LostEpisode(
            episode_id=stats.episode_id,
            model=m,
            group_key=stats.group_key,
            status=stats.status,
            reason=stats.reason or f"no sample of model {m}",
        )  # fmt: skip
        for m in stats.models
        if m not in sent
    ]
