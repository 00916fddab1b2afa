"""Run order, successive halving over seeds, the total budget and the time-left estimate."""

from __future__ import annotations

import pytest

from swarmrl.research.state import STARTUP_S, Attempt, StudyState


def finish(state: StudyState, run_id: str, metric: float | None, minutes: float = 10.0) -> None:
    run = state.runs[run_id]
    run.status, run.metric = "done", metric
    run.attempts = [Attempt(n=1, run_dir="x", started=0.0, ended=minutes * 60)]


def test_runs_go_seed_major_and_a_checkpoint_holds_later_seeds(make_state) -> None:
    state = make_state()
    assert [r.id for r in state.runnable()] == ["base-s1", "a-s1", "b-s1", "c-s1"]
    assert state.due_checkpoint() is None
    for rid, v in (("base-s1", 0.5), ("a-s1", 0.7), ("b-s1", 0.2)):
        finish(state, rid, v)
    assert state.due_checkpoint() is None  # c-s1 still to run
    finish(state, "c-s1", None)  # no metric: ranks last
    assert state.due_checkpoint() == 1


def test_halving_keeps_the_upper_half_and_the_baseline(make_state) -> None:
    state = make_state()
    for rid, v in (("base-s1", 0.1), ("a-s1", 0.7), ("b-s1", 0.9), ("c-s1", None)):
        finish(state, rid, v)
    d, halved = state.decide(1, now=5.0)
    assert d.ranking == [("b", 0.9), ("a", 0.7), ("c", None)]
    assert d.kept == ["b", "a"] and d.stopped == ["c"]  # ceil(0.5 * 3) = 2
    assert sorted(r.id for r in halved) == ["c-s2", "c-s3"]
    assert "rank 3 of 3" in state.runs["c-s2"].note
    assert [r.id for r in state.runnable()] == [
        "base-s2",
        "a-s2",
        "b-s2",
    ]  # seed 3 waits for checkpoint 2
    for rid, v in (("base-s2", 0.1), ("a-s2", 0.1), ("b-s2", 0.9)):
        finish(state, rid, v)
    assert state.due_checkpoint() == 2
    d2, _ = state.decide(2)
    assert [a for a, _ in d2.ranking] == ["b", "a"] and d2.stopped == ["a"]
    assert d2.ranking[1][1] == pytest.approx(0.4)  # a's mean over seeds 1-2
    assert [r.id for r in state.runnable()] == ["base-s3", "b-s3"]
    assert state.due_checkpoint() is None


def test_lower_is_better_and_min_arms(make_state) -> None:
    state = make_state(goal="min", extra="[early_stop]\nafter_seeds = [1]\nkeep = 0.3\nmin_arms = 2\n")
    for rid, v in (("base-s1", 0.5), ("a-s1", 0.7), ("b-s1", 0.2), ("c-s1", 0.4)):
        finish(state, rid, v)
    d, _ = state.decide(1)
    assert d.kept == ["b", "c"] and d.stopped == ["a"]


def test_time_left_packs_runs_on_the_slots(make_state) -> None:
    state = make_state(extra="")
    assert state.run_estimate_s() == 10 * 60 + STARTUP_S
    finish(state, "base-s1", 0.5, minutes=11)
    assert state.run_estimate_s() == 660
    state.runs["a-s1"].status = "running"
    state.runs["a-s1"].attempts = [Attempt(n=1, run_dir="x", started=1000.0)]
    # 10 runs to start of 660 s; a-s1 has 660 - 60 s left; one slot: all in a row
    assert state.eta_s(now=1060.0) == 600 + 10 * 660
    # two slots: 600 + 5 * 660 on one, 5 * 660 on the other
    state.parallel = 2
    assert state.eta_s(now=1060.0) == 600 + 5 * 660


def test_the_total_budget(make_state) -> None:
    state = make_state(extra="")
    state.study.budget.total_minutes = 30
    state.elapsed_s = 25 * 60
    assert state.over_budget()
    state.elapsed_s = 10 * 60
    assert not state.over_budget()
