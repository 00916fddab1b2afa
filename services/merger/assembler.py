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


def episode_stats(
    episode_id: str,
    calls: list[LlmEvent],
    status: Literal["merged", "empty", "aborted", "timeout"],
    reason: str,
    begin: BeginEvent | None = None,
    **fields: Any,
) -> MergeStats:
    """An episode's MergeStats: its group, models and eval flag (when begin is known), what its calls
    cost, its status and why (a dropped one's reason); `fields`: what a merged one became."""
    identity = {"group_key": begin.group, "models": list(begin.models), "eval": begin.eval} if begin else {}
    return MergeStats(
        episode_id=episode_id,
        **identity,
        agents=len({c.agent for c in calls}),
        calls=len(calls),
        tokens_before=sum(len(c.prompt_ids) + len(c.output_ids) for c in calls),
        trained_tokens_before=sum(len(c.output_ids) for c in calls),
        status=status,
        reason=reason,
        **fields,
    )


def assemble(
    begin: BeginEvent, calls: list[LlmEvent], rewards: list[RewardEvent], opts: MergeOptions = MergeOptions()
) -> tuple[list[Sample], MergeStats]:
    """Merge an ended episode's calls into samples; `calls` must be in stream order."""
    initial = [Timeline.from_call(c, i) for i, c in enumerate(calls)]
    kept = [] if begin.eval else merge_timelines(initial, opts)
    by_role: dict[tuple[str, str], list[Timeline]] = defaultdict(list)
    for t in kept:  # already in call order
        by_role[t.agent, t.model].append(t)
    team = sum(r.value for r in rewards if not r.agent)
    task = begin.task.get("name")
    samples = []
    for (agent, model), timelines in by_role.items():
        for index, t in enumerate(timelines):
            samples.append(
                Sample(
                    sample_id=f"{begin.episode_id}.{agent}.{model}.{index}",
                    model=model,
                    episode_id=begin.episode_id,
                    agent=agent,
                    task_id=begin.task_id,
                    group_key=begin.group,
                    group_size=begin.group_size,
                    task=task if isinstance(task, str) else "",
                    client_id=begin.client_id,
                    client_version=begin.client_version,
                    token_ids=t.tokens,
                    loss_mask=t.loss_mask,
                    logprobs=t.logprobs,
                    policy_versions=t.policy_versions,
                    reward=team + sum(r.value for r in rewards if r.agent == agent),
                    index=index,
                    n_samples=len(timelines),
                    n_calls=t.n_calls,
                )
            )
    stats = episode_stats(
        begin.episode_id,
        calls,
        "merged" if calls else "empty",
        "eval" if begin.eval else "",
        begin,
        timelines_kept=len(samples),
        tokens_after=sum(len(s.token_ids) for s in samples),
        trained_tokens_after=sum(sum(s.loss_mask) for s in samples),
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
