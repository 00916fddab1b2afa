"""One finished episode → its training samples and merge statistics (pure logic).

- sample_id = `<episode_id>.<agent>.<model>.<index>`: index counts one (agent, model)'s samples in
  call order, n_samples their count (a trainer waits for n_samples of each agent). It depends only
  on the events in stream order, so a replay yields the same ids and JetStream drops the copies.
- task = the begin event's `task["name"]` when it is a string, else "".
- group_key is the begin event's resolved group (`group_key`, else `task_id`).
- An agent's reward = its own reward events plus the team's (events whose `agent` is empty).
- Eval episodes are never trained on: no samples; MergeStats `merged`, reason `eval`, nothing kept.
- An ended episode without LLM calls gets status `empty`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from swarmrl.schemas import BeginEvent, LlmEvent, LostEpisode, MergeStats, RewardEvent, Sample
from swarmrl.services.merger.timelines import MergeOptions, Timeline, merge_timelines


def agent_rewards(rewards: list[RewardEvent], agents: set[str]) -> dict[str, float]:
    team = sum(r.value for r in rewards if not r.agent)
    return {a: team + sum(r.value for r in rewards if r.agent == a) for a in agents}


def sample_id(episode_id: str, agent: str, model: str, index: int) -> str:
    return f"{episode_id}.{agent}.{model}.{index}"


def task_name(begin: BeginEvent) -> str:
    name = begin.task.get("name")
    return name if isinstance(name, str) else ""


def _stats(episode_id: str, begin: BeginEvent | None, calls: list[LlmEvent], **fields: Any) -> MergeStats:
    """MergeStats with what every episode carries: its group, models and eval flag (when begin is
    known), and what its calls cost."""
    identity = {"group_key": begin.group, "models": list(begin.models), "eval": begin.eval} if begin else {}
    return MergeStats(
        episode_id=episode_id,
        **identity,
        agents=len({c.agent for c in calls}),
        calls=len(calls),
        tokens_before=sum(len(c.prompt_ids) + len(c.output_ids) for c in calls),
        trained_tokens_before=sum(len(c.output_ids) for c in calls),
        **fields,
    )


def dropped_stats(
    episode_id: str,
    calls: list[LlmEvent],
    status: Literal["aborted", "timeout"],
    reason: str,
    begin: BeginEvent | None = None,
) -> MergeStats:
    """Stats of an episode dropped without samples: what it cost, and why it was dropped."""
    return _stats(episode_id, begin, calls, status=status, reason=reason)


def assemble(
    begin: BeginEvent, calls: list[LlmEvent], rewards: list[RewardEvent], opts: MergeOptions = MergeOptions()
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
    stats = _stats(
        begin.episode_id,
        begin,
        calls,
        status="merged" if calls else "empty",
        timelines_kept=len(samples),
        tokens_after=sum(len(s.token_ids) for s in samples),
        trained_tokens_after=sum(sum(s.loss_mask) for s in samples),
        reason="eval" if begin.eval else "",
        sample_models=sorted({s.model for s in samples}),
    )
    return samples, stats


def lost_episodes(stats: MergeStats) -> list[LostEpisode]:
    """One record per model a training episode sends no sample, so that its trainer counts the
    episode out of its group instead of waiting for it."""
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
