"""Timeline merging and sample building on handcrafted episodes (no NATS)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from swarmrl.services.merger.assembler import assemble, episode_stats, lost_episodes
from swarmrl.services.merger.timelines import MergeOptions, Timeline, merge_timelines
from tests.unit.merger.factories import begin, chain, llm, logprobs, reward

TEXT = MergeOptions(mode="text")


def trained(sample) -> list[int]:
    return [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]


def assert_invariants(samples, stats) -> None:
    """Loss mask exactly on generated tokens: known logprobs, a version >= 0; zero elsewhere."""
    for s in samples:
        for m, lp, v in zip(s.loss_mask, s.logprobs, s.policy_versions, strict=True):
            assert (lp, v) == (0.0, -1) if m == 0 else (lp < 0 and not math.isnan(lp) and v >= 0)
    assert stats.trained_tokens_after == stats.trained_tokens_before  # every output trained exactly once
    assert stats.timelines_kept == len(samples)
    assert stats.tokens_after == sum(len(s.token_ids) for s in samples)


@pytest.mark.parametrize("turns", [3, 6])
def test_prefix_chain_becomes_one_sample_with_every_output_trainable(turns: int) -> None:
    calls = chain(turns)
    samples, stats = assemble(begin(), calls, [reward(1.0)])
    assert len(samples) == 1
    s = samples[0]
    assert (s.sample_id, s.index, s.n_samples, s.n_calls) == ("ep1.a.m.0", 0, 1, turns)
    assert (s.model, s.task_id, s.group_key, s.client_id, s.client_version) == ("m", "task-1", "task-1",
                                                                               "agent-proc", "v7")  # fmt: skip
    assert s.token_ids == calls[-1].prompt_ids + calls[-1].output_ids
    assert trained(s) == [t for c in calls for t in c.output_ids]
    for c in calls:  # each output sits where it was generated, with its own logprobs and version
        start = len(c.prompt_ids)
        end = start + len(c.output_ids)
        assert s.logprobs[start:end] == logprobs(c.policy_version, len(c.output_ids))
        assert s.policy_versions[start:end] == [c.policy_version] * len(c.output_ids)
    assert s.reward == 1.0
    assert stats.status == "merged" and (stats.agents, stats.calls) == (1, turns)
    assert stats.tokens_before == sum(len(c.prompt_ids) + len(c.output_ids) for c in calls)
    assert stats.tokens_after == len(s.token_ids) < stats.tokens_before
    assert stats.trained_tokens_before == sum(len(c.output_ids) for c in calls)
    assert_invariants(samples, stats)


def test_calls_out_of_length_order_still_merge_transitively() -> None:
    calls = chain(4)
    samples, stats = assemble(begin(), [calls[2], calls[0], calls[3], calls[1]], [])
    assert [s.n_calls for s in samples] == [4]
    assert_invariants(samples, stats)


def test_retry_with_edited_history_keeps_both_timelines() -> None:
    first, second = chain(2)
    # The agent retries turn 2 after rewriting the system prompt: no longer an extension of `first`.
    edited = llm([9, *second.prompt_ids[1:]], [201, 202], version=5, seq=2)
    samples, stats = assemble(begin(), [first, second, edited], [])
    assert [(s.n_calls, s.token_ids[0]) for s in samples] == [(2, 1), (1, 9)]
    assert [s.sample_id for s in samples] == ["ep1.a.m.0", "ep1.a.m.1"]
    assert [s.n_samples for s in samples] == [2, 2]
    assert_invariants(samples, stats)


def test_branches_share_an_absorbed_trunk_once() -> None:
    first, second = chain(2)
    # A retry of turn 2 from the same context (a branch): both branches extend `first`.
    branch = llm(second.prompt_ids, [300, 301, 302], version=9, seq=2)
    samples, stats = assemble(begin(), [first, second, branch], [])
    assert [s.n_calls for s in samples] == [2, 1]  # the trunk went to the shorter (earlier) branch
    assert_invariants(samples, stats)


def test_a_call_whose_output_the_longer_call_regenerated_is_not_absorbed() -> None:
    # Same prompt, and B's own output starts with A's: A's tokens are a prefix of B's, but B generated
    # them itself, so absorbing A would drop A's sample.
    a = llm([1, 2], [7, 8], version=1, seq=0)
    b = llm([1, 2], [7, 8, 9], version=2, seq=1)
    samples, stats = assemble(begin(), [a, b], [])
    assert [s.n_calls for s in samples] == [1, 1]
    assert_invariants(samples, stats)


def test_two_agents_never_merge_and_get_their_own_plus_team_rewards() -> None:
    a_calls = chain(2, agent="a")
    # Agent b sees exactly agent a's tokens as its prompt (a shared transcript) but is another agent.
    b_call = llm(a_calls[-1].prompt_ids + a_calls[-1].output_ids, [400], agent="b", seq=5)
    rewards = [reward(1.0), reward(0.5, agent="a", seq=2), reward(-2.0, agent="b", seq=3), reward(1.0, seq=4)]
    samples, stats = assemble(begin(agents=["a", "b"]), [*a_calls, b_call], rewards)
    by_agent = {s.agent: s for s in samples}
    assert set(by_agent) == {"a", "b"} and len(samples) == 2
    assert (by_agent["a"].n_calls, by_agent["b"].n_calls) == (2, 1)
    assert by_agent["a"].reward == 2.5 and by_agent["b"].reward == 0.0
    assert by_agent["b"].sample_id == "ep1.b.m.0" and sum(by_agent["b"].loss_mask) == 1
    assert stats.agents == 2
    assert_invariants(samples, stats)


def test_one_agent_two_models_never_merge() -> None:
    calls = chain(2, model="m1")
    other = llm(calls[-1].prompt_ids + calls[-1].output_ids, [500], model="m2", seq=9)
    samples, _ = assemble(begin(), [*calls, other], [])
    # index and n_samples count per (agent, model): each model's trainer sees a complete agent
    assert [(s.model, s.sample_id, s.index, s.n_samples) for s in samples] == [
        ("m1", "ep1.a.m1.0", 0, 1),
        ("m2", "ep1.a.m2.0", 0, 1),
    ]


def test_two_agents_on_two_models_count_their_samples_per_model() -> None:
    # Agent a calls alpha twice (a retry with an edited history: two samples) and beta once;
    # agent b calls beta once. Rewards are per agent, whatever model the sample is for.
    a1, a2 = chain(2, model="alpha")
    a_retry = llm([9, *a2.prompt_ids[1:]], [201], model="alpha", seq=2)
    a_beta = llm([70, 71], [72], model="beta", seq=3)
    b_beta = llm([80, 81], [82, 83], agent="b", model="beta", seq=4)
    rewards = [reward(1.0, agent="a", seq=1), reward(-1.0, agent="b", seq=2)]
    samples, stats = assemble(begin(agents=["a", "b"]), [a1, b_beta, a2, a_beta, a_retry], rewards)
    got = [(s.sample_id, s.model, s.agent, s.index, s.n_samples, s.reward) for s in samples]
    assert sorted(got) == [
        ("ep1.a.alpha.0", "alpha", "a", 0, 2, 1.0),
        ("ep1.a.alpha.1", "alpha", "a", 1, 2, 1.0),
        ("ep1.a.beta.0", "beta", "a", 0, 1, 1.0),
        ("ep1.b.beta.0", "beta", "b", 0, 1, -1.0),
    ]
    assert len({s.sample_id for s in samples}) == len(samples) == stats.timelines_kept
    assert_invariants(samples, stats)
    # Deterministic: the same events (a replay) give the same ids in the same order.
    again, _ = assemble(begin(agents=["a", "b"]), [a1, b_beta, a2, a_beta, a_retry], rewards)
    assert [s.sample_id for s in again] == [s.sample_id for s in samples]
    assert stats.sample_models == ["alpha", "beta"]


def test_stats_name_only_the_models_that_got_samples() -> None:
    # A team episode whose second role never acted: beta's trainer must hear it gets nothing.
    (a1,) = chain(1, model="alpha")
    _, stats = assemble(begin(agents=["a", "b"], models=["alpha", "beta"]), [a1], [])
    assert stats.models == ["alpha", "beta"] and stats.sample_models == ["alpha"]
    assert [(r.model, r.status) for r in lost_episodes(stats)] == [("beta", "merged")]


def test_a_dropped_training_episode_is_lost_to_every_model_and_an_eval_one_to_none() -> None:
    dropped = episode_stats("ep1", chain(1), "aborted", "client killed", begin(models=["alpha", "beta"]))
    assert [(r.episode_id, r.model, r.group_key, r.reason) for r in lost_episodes(dropped)] == [
        ("ep1", m, dropped.group_key, "client killed") for m in ("alpha", "beta")
    ]
    assert lost_episodes(dropped.model_copy(update={"eval": True})) == []


@pytest.mark.parametrize(
    ("task", "name"),
    [({"name": "countdown", "n": 3}, "countdown"), ({"name": 7}, ""), ({}, ""), ({"title": "x"}, "")],
)
def test_sample_task_is_the_begin_task_name_when_it_is_a_string(task: dict[str, Any], name: str) -> None:
    samples, _ = assemble(begin(task=task), chain(2), [])
    assert [s.task for s in samples] == [name]


def test_text_mode_merges_when_messages_and_tokens_are_prefixes() -> None:
    calls = chain(4)
    samples, stats = assemble(begin(), calls, [], TEXT)
    assert [s.n_calls for s in samples] == [4]
    assert_invariants(samples, stats)


def test_text_mode_normalises_whitespace_and_tool_call_json() -> None:
    tool_text = 'ok <tool_call>{"name": "add", "arguments": {"x": 1, "y": 2}}</tool_call>'
    a = llm([1, 2], [3, 4], messages=[{"role": "user", "content": "add  1\n2"}], output_text=tool_text)
    echoed: dict[str, Any] = {"role": "assistant", "content": " ok ",
              "tool_calls": [{"id": "call_1", "type": "function",
                              "function": {"name": "add", "arguments": '{"y":2,  "x":1}'}}]}  # fmt: skip
    request: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "add 1 2"}]}, echoed,
               {"role": "tool", "tool_call_id": "call_1", "content": "3"}]  # fmt: skip
    b = llm([1, 2, 3, 4, 5], [6], messages=request, output_text="3", seq=1)
    samples, _ = assemble(begin(), [a, b], [], TEXT)
    assert [s.n_calls for s in samples] == [2]
    # The echoed call with other arguments is not the reply A generated.
    wrong = {**echoed, "tool_calls": [{"function": {"name": "add", "arguments": '{"x": 1, "y": 3}'}}]}
    b2 = llm([1, 2, 3, 4, 5], [6], messages=[request[0], wrong, request[2]], seq=1)
    assert [s.n_calls for s in assemble(begin(), [a, b2], [], TEXT)[0]] == [1, 1]


def test_token_drift_keeps_both_timelines_in_either_mode() -> None:
    first, second = chain(2)
    # Same messages, but the gateway re-tokenised the first reply (e.g. lost its cache): token drift.
    drifted = [*first.prompt_ids, 999, *second.prompt_ids[len(first.prompt_ids) + 1 :]]
    second = second.model_copy(update={"prompt_ids": drifted})
    for opts in (MergeOptions(), TEXT):
        samples, stats = assemble(begin(), [first, second], [], opts)
        assert [s.n_calls for s in samples] == [1, 1]
        assert_invariants(samples, stats)


def test_text_mode_refuses_when_messages_disagree_although_tokens_match() -> None:
    first, second = chain(2)
    edited = [
        {**m, "content": "a different move"} if m["role"] == "assistant" else m for m in second.messages
    ]
    second = second.model_copy(update={"messages": edited})
    assert [s.n_calls for s in assemble(begin(), [first, second], [])[0]] == [2]
    assert [s.n_calls for s in assemble(begin(), [first, second], [], TEXT)[0]] == [1, 1]


def test_tool_list_change_blocks_text_merging_unless_ignored() -> None:
    first, second = chain(2)
    first = first.model_copy(update={"tools": [{"type": "function", "function": {"name": "look"}}]})
    second = second.model_copy(update={"tools": [{"type": "function", "function": {"name": "move"}}]})
    assert [s.n_calls for s in assemble(begin(), [first, second], [], TEXT)[0]] == [1, 1]
    ignore = MergeOptions(mode="text", ignore_tools=True)
    assert [s.n_calls for s in assemble(begin(), [first, second], [], ignore)[0]] == [2]
    assert [s.n_calls for s in assemble(begin(), [first, second], [])[0]] == [2]  # tokens decide


def test_merge_off_keeps_every_call() -> None:
    calls = chain(3)
    samples, stats = assemble(begin(), calls, [reward(0.25)], MergeOptions(merge=False))
    assert [(s.index, s.n_samples, s.n_calls) for s in samples] == [(0, 3, 1), (1, 3, 1), (2, 3, 1)]
    assert [s.token_ids for s in samples] == [c.prompt_ids + c.output_ids for c in calls]
    assert stats.tokens_after == stats.tokens_before and all(s.reward == 0.25 for s in samples)
    assert_invariants(samples, stats)


def test_eval_episode_yields_no_samples_but_records_stats() -> None:
    calls = chain(3)
    samples, stats = assemble(begin(eval=True), calls, [reward(1.0)])
    assert samples == []
    assert (stats.status, stats.reason, stats.calls, stats.timelines_kept, stats.tokens_after) == (
        "merged", "eval", 3, 0, 0)  # fmt: skip
    assert stats.tokens_before == sum(len(c.prompt_ids) + len(c.output_ids) for c in calls)


def test_episode_without_calls_is_empty() -> None:
    samples, stats = assemble(begin(group_key="g"), [], [reward(1.0)])
    assert samples == [] and stats.status == "empty"


def test_group_key_and_inputs_untouched() -> None:
    calls = chain(2)
    initial = [Timeline.from_call(c, i) for i, c in enumerate(calls)]
    masks = [list(t.loss_mask) for t in initial]
    merge_timelines(initial)
    assert [t.loss_mask for t in initial] == masks
    assert assemble(begin(group_key="g"), calls, [])[0][0].group_key == "g"
