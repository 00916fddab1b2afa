from swarmrl.schemas import LlmEvent, RewardEvent
from swarmrl.services.merger.assembler import assemble
from swarmrl.services.trainer.grouping import GroupBuffer
from swarmrl.services.trainer.grpo import check_sample, score_group
from tests.unit.merger.factories import begin, chain, llm, reward
from tests.unit.trainer.samples import make_sample


def _buffer(**kw) -> GroupBuffer:
    return GroupBuffer(**({"num_repeat": 3, "timeout_s": 10.0, "min_group_size": 2} | kw))


def test_group_ready_at_num_repeat_distinct_episodes() -> None:
    buf = _buffer()
    buf.add(make_sample("e1", 1.0), "h1", now=0.0)
    buf.add(make_sample("e2", 0.0), "h2", now=0.0)
    buf.add(make_sample("x1", 0.0, group="other"), "hx", now=0.0)
    assert buf.pop_ready(now=1.0) == ([], [])
    buf.add(make_sample("e3", 0.0), "h3", now=1.0)
    ready, dropped = buf.pop_ready(now=1.0)
    assert dropped == [] and len(ready) == 1
    assert ready[0].key == "g" and ready[0].episodes == 3 and not ready[0].partial
    assert [h.handle for h in ready[0].items] == ["h1", "h2", "h3"]
    assert len(buf) == 1  # the other group waits


def test_a_group_has_the_size_its_client_declared_and_a_disagreeing_sample_is_refused() -> None:
    """The trainer's num_repeat (3) applies only to groups that declared none: a client playing
    groups of 2 gets groups of 2, not groups re-sliced to 3 nor a wait for a timeout."""
    buf = _buffer()
    first = make_sample("e1", 1.0, group_size=2)
    assert buf.mismatch(first) is None
    buf.add(first, "h1", now=0.0)
    wrong = make_sample("e9", 0.0, group_size=4)
    assert buf.mismatch(wrong) == (
        "group_size: episode e9 declares 4 episodes for group 'g', whose other episodes declared 2"
    )
    assert buf.mismatch(make_sample("e8", 0.0, group="h", group_size=4)) is None  # another group
    buf.add(make_sample("e2", 0.0, group_size=2), "h2", now=0.0)
    ready, dropped = buf.pop_ready(now=0.0)
    assert dropped == [] and [g.episodes for g in ready] == [2] and not ready[0].partial
    assert buf.sizes == {}  # forgotten with the group: the key may start over with another size
    assert buf.mismatch(wrong) is None


def test_multi_sample_episode_counts_once_and_only_when_complete() -> None:
    buf = _buffer(num_repeat=2)
    buf.add(make_sample("e1", 1.0, index=0, n_samples=2), "a", now=0.0)
    buf.add(make_sample("e2", 0.0), "b", now=0.0)
    assert buf.pop_ready(now=0.0)[0] == []  # e1 has 1 of its 2 samples
    buf.add(make_sample("e1", 1.0, index=1, n_samples=2), "c", now=0.0)
    (group,), _ = buf.pop_ready(now=0.0)
    assert group.episodes == 2 and len(group.items) == 3


def test_extra_episodes_start_the_next_group() -> None:
    buf = _buffer(num_repeat=2)
    for i in range(3):
        buf.add(make_sample(f"e{i}", float(i)), f"h{i}", now=0.0)
    ready, _ = buf.pop_ready(now=0.0)
    assert [[h.handle for h in g.items] for g in ready] == [["h0", "h1"]]
    assert len(buf) == 1


def test_timeout_trains_partial_group_with_min_size() -> None:
    buf = _buffer(num_repeat=4, min_group_size=2)
    buf.add(make_sample("e1", 1.0), "h1", now=0.0)
    buf.add(make_sample("e2", 0.0), "h2", now=5.0)
    buf.add(make_sample("e3", 0.0, index=0, n_samples=2), "h3", now=5.0)  # incomplete
    assert buf.pop_ready(now=9.9) == ([], [])
    ready, dropped = buf.pop_ready(now=10.0)
    assert len(ready) == 1 and ready[0].partial and ready[0].episodes == 2
    assert [h.handle for h in dropped] == ["h3"]
    assert buf.counts["partial_groups"] == 1 and buf.counts["timeout_dropped_samples"] == 1
    assert len(buf) == 0


def test_timeout_drops_group_below_min_size() -> None:
    buf = _buffer(num_repeat=4, min_group_size=2)
    buf.add(make_sample("e1", 1.0), "h1", now=0.0)
    ready, dropped = buf.pop_ready(now=11.0)
    assert ready == [] and [h.handle for h in dropped] == ["h1"]
    assert buf.counts["timeout_dropped_groups"] == 1
    assert buf.pending == {}


def test_redelivery_replaces_handle_without_duplicating() -> None:
    buf = _buffer(num_repeat=2)
    s = make_sample("e1", 1.0)
    buf.add(s, "old", now=0.0)
    buf.add(s, "new", now=1.0)
    assert len(buf) == 1 and buf.counts["duplicate_samples"] == 1
    buf.add(make_sample("e2", 0.0), "h2", now=1.0)
    (group,), _ = buf.pop_ready(now=1.0)
    assert [h.handle for h in group.items] == ["new", "h2"]


def test_a_lost_episode_is_counted_out_instead_of_waited_for() -> None:
    buf = _buffer(num_repeat=4)
    buf.note_lost("g", "lost0", "L0", now=0.0)  # the merger dropped one episode (its client aborted)
    for i in range(3):
        buf.add(make_sample(f"e{i}", float(i % 2)), f"h{i}", now=0.0)
    (group,), dropped = buf.pop_ready(now=1.0)  # long before the 10 s timeout
    assert dropped == [] and group.partial and group.episodes == 3
    assert group.lost == ["L0"]  # the record's handle goes with the group: acked with its samples
    assert buf.counts["short_groups"] == 1 and "g" not in buf.lost and buf.lost_handles() == []
    for i in range(3, 6):  # the next round of the same key waits for a full group again
        buf.add(make_sample(f"e{i}", float(i % 2)), f"h{i}", now=2.0)
    assert buf.pop_ready(now=3.0) == ([], [])


def test_lost_episodes_leaving_too_few_drop_the_group_at_once() -> None:
    buf = _buffer(num_repeat=4, min_group_size=2)
    for i in range(3):
        buf.note_lost("g", f"lost{i}", f"L{i}", now=0.0)
    buf.add(make_sample("e0", 1.0), "h0", now=0.0)
    ready, dropped = buf.pop_ready(now=1.0)
    assert ready == [] and [h.handle for h in dropped] == ["h0"]
    assert buf.counts["lost_dropped_groups"] == 1 and buf.counts["timeout_dropped_samples"] == 0
    assert len(buf) == 0 and buf.spent == ["L0", "L1", "L2"]  # acked with the drop


def test_a_redelivered_lost_record_counts_once() -> None:
    """After a restart (or an ack timeout) the same record comes again: held, it keeps the newest
    handle; already used, it is spent at once, and never counts out a second episode."""
    buf = _buffer(num_repeat=4)
    buf.note_lost("g", "lost0", "old", now=0.0)
    buf.note_lost("g", "lost0", "new", now=0.5)
    assert buf.lost_handles() == ["new"] and buf.counts["lost_episodes"] == 1
    for i in range(3):
        buf.add(make_sample(f"e{i}", float(i % 2)), f"h{i}", now=0.0)
    (group,), _ = buf.pop_ready(now=1.0)
    assert group.lost == ["new"]
    buf.note_lost("g", "lost0", "again", now=2.0)
    assert buf.spent == ["again"] and buf.lost == {} and buf.counts["lost_episodes"] == 1


def test_an_unused_lost_record_is_spent_after_the_timeout() -> None:
    """A record whose group never shows up (all its episodes were lost) or was emitted without it is
    not held forever: once its key has nothing pending for `timeout_s`, it is spent."""
    buf = _buffer(num_repeat=4)  # timeout 10 s
    buf.note_lost("nobody", "lost0", "L0", now=0.0)
    buf.note_lost("busy", "lost1", "L1", now=0.0)
    buf.add(make_sample("e0", 1.0, group="busy"), "h0", now=5.0)
    assert buf.pop_ready(now=9.0) == ([], []) and buf.spent == []
    buf.pop_ready(now=10.0)
    assert buf.spent == ["L0"] and buf.lost_handles() == ["L1"]  # "busy" still waits for its group


def test_a_record_without_pending_samples_is_acked_soon_and_its_credit_kept() -> None:
    """Held until the group timeout, the records of groups lost whole (a killed client's) counted as
    backlog, and admission held every new group for 5 minutes (chaos run, 2026-11-26). Now they are
    acked after `hold_s`; the credit still counts the episode out if its group's samples come later."""
    buf = GroupBuffer(num_repeat=4, timeout_s=300.0, min_group_size=2, hold_s=10.0)
    buf.note_lost("g", "lost0", "L0", now=0.0)
    buf.pop_ready(now=9.0)
    assert buf.spent == [] and buf.lost_handles() == ["L0"]
    buf.pop_ready(now=10.0)
    assert buf.spent == ["L0"] and buf.lost_handles() == []  # acked: no longer backlog
    for i in range(3):
        buf.add(make_sample(f"e{i}", float(i % 2)), f"h{i}", now=60.0)
    (group,), _ = buf.pop_ready(now=61.0)
    assert group.episodes == 3 and group.partial and group.lost == []  # counted out all the same
    buf.note_lost("k", "lost1", "L1", now=100.0)
    buf.pop_ready(now=400.0)
    assert "k" not in buf.lost and buf.credits == {}  # forgotten after the group timeout


def test_an_episode_discarded_on_arrival_leaves_its_group_with_its_held_samples() -> None:
    """A sample the trainer drops on arrival (stale) takes its episode out of its group: the group
    completes with the others at once, not at the timeout, and the episode's other samples, held or
    still to come, are dropped with it."""
    buf = _buffer(num_repeat=4)
    for i in range(2):
        buf.add(make_sample(f"e{i}", float(i)), f"h{i}", now=0.0)
    buf.add(make_sample("e2", 1.0, index=0, n_samples=2), "h2a", now=0.0)
    siblings = buf.discard(make_sample("e2", 1.0, index=1, n_samples=2))
    assert [h.handle for h in siblings] == ["h2a"] and buf.is_discarded(make_sample("e2", 0.0))
    assert buf.discard(make_sample("e2", 1.0, index=1, n_samples=2)) == []  # counted out once
    assert buf.pop_ready(now=1.0) == ([], [])  # 2 complete + 1 lost < 4
    buf.add(make_sample("e3", 0.0), "h3", now=1.0)
    (group,), dropped = buf.pop_ready(now=1.0)  # long before the 10 s timeout
    assert dropped == [] and group.partial and [h.handle for h in group.items] == ["h0", "h1", "h3"]
    assert len(buf) == 0 and buf.lost == {}


def _team_episode(eid: str, a_reward: float, b_reward: float) -> tuple[list[LlmEvent], list[RewardEvent]]:
    """Agent a calls alpha (a 2-turn chain, then a retry with an edited history: 2 samples) and beta
    once; agent b calls alpha once. Each agent has its own reward."""
    a_alpha = chain(2, agent="a", model="alpha", episode_id=eid)
    calls = [
        a_alpha[0],
        llm([40, 41], [42], agent="a", model="beta", episode_id=eid, seq=2),
        a_alpha[1],
        llm([30, 31], [32, 33], agent="b", model="alpha", episode_id=eid, seq=3),
        llm([9, *a_alpha[1].prompt_ids[1:]], [5], agent="a", model="alpha", episode_id=eid, seq=4),
    ]
    rewards = [
        reward(a_reward, agent="a", episode_id=eid, seq=1),
        reward(b_reward, agent="b", episode_id=eid, seq=2),
    ]
    return calls, rewards


def test_one_models_trainer_completes_groups_from_two_model_episodes() -> None:
    """The merger counts index/n_samples per (agent, model), so alpha's trainer, which never sees
    beta's samples, still finds agent a complete in every episode."""
    buf = _buffer(num_repeat=2)
    alpha = []
    for i, (ra, rb) in enumerate([(1.0, -1.0), (0.0, 0.5)]):
        eid = f"team{i}"
        calls, rewards = _team_episode(eid, ra, rb)
        samples, _ = assemble(begin(eid, agents=["a", "b"], models=["alpha", "beta"]), calls, rewards)
        assert sorted(s.model for s in samples) == ["alpha", "alpha", "alpha", "beta"]
        for s in samples:
            if s.model == "alpha":  # what `swarm.samples.alpha` delivers
                assert check_sample(s, "alpha", vocab_size=1000) is None
                buf.add(s, s.sample_id, now=0.0)
                alpha.append(s)
        if i == 0:
            assert buf.pop_ready(now=0.0) == ([], [])  # one complete episode, two needed
    (group,), dropped = buf.pop_ready(now=0.0)
    assert dropped == [] and not group.partial and group.episodes == 2 and len(buf) == 0
    assert sorted(h.handle for h in group.items) == sorted(s.sample_id for s in alpha)
    assert sorted(h.sample.sample_id for h in group.items if h.sample.episode_id == "team0") == [
        "team0.a.alpha.0", "team0.a.alpha.1", "team0.b.alpha.0",
    ]  # fmt: skip
    by_agent = {(h.sample.episode_id, h.sample.agent): h.sample.reward for h in group.items}
    assert by_agent == {("team0", "a"): 1.0, ("team0", "b"): -1.0, ("team1", "a"): 0.0, ("team1", "b"): 0.5}
    score = score_group([h.sample for h in group.items], 1, max_staleness=10, min_group_size=2)
    adv = {
        (h.sample.episode_id, h.sample.agent): a for h, a in zip(group.items, score.advantages, strict=True)
    }
    assert score.status == "ok" and len(set(adv.values())) == 4  # every (episode, agent) its own advantage


def test_a_group_short_of_its_size_is_reported_once_after_its_last_episode_went_quiet() -> None:
    """A client that plays one episode per task instance (the old README snippet) fills no group: the
    trainer says so once, `after_s` after the group's newest episode, naming the client."""
    buf = _buffer(num_repeat=4)  # timeout 10 s
    buf.add(make_sample("e0", 1.0).model_copy(update={"client_id": "c"}), "h0", now=0.0)
    buf.note_lost("g", "gone", "L", now=0.0)
    assert buf.stalled(now=2.9, after_s=3.0) == []
    buf.add(
        make_sample("e1", 0.0).model_copy(update={"client_id": "c"}), "h1", now=2.0
    )  # a new episode restarts the wait
    assert buf.stalled(now=4.9, after_s=3.0) == []
    (stall,) = buf.stalled(now=5.0, after_s=3.0)
    assert (stall.key, stall.episodes, stall.size, stall.lost, stall.clients) == ("g", 2, 4, 1, ["c"])
    assert buf.stalled(now=9.0, after_s=3.0) == []  # once per group
