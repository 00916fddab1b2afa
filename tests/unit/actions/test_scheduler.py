"""The action scheduler's policies on hand-made cases (virtual time, no service)."""

import pytest

from swarmrl.services.actions.model import Action, Demand
from swarmrl.services.actions.scheduler import POLICIES, PoolSpec, Predictor, Scheduler


def act(
    id: str,
    t: float = 0.0,
    *,
    cpu: int = 1,
    accel: int = 0,
    mem: int = 100,
    kind: str = "python",
    traj: str = "",
) -> Action:
    return Action(id, kind, Demand(cpu=cpu, mem_mb=mem, accel=accel), traj or f"traj-{id}", t)


def ids(actions: list[Action]) -> list[str]:
    return [a.id for a in actions]


def fixed(cpu: int, accel: int = 0) -> dict[str, PoolSpec]:
    return {"cpu": PoolSpec(cpu, cpu), "accel": PoolSpec(accel, accel)}


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="'lifo'; known: elastic, fifo, static"):
        Scheduler("lifo", fixed(1), mem_budget_mb=1000)
    assert sorted(POLICIES) == ["elastic", "fifo", "static"]


def test_pool_spec_checks_its_bounds():
    with pytest.raises(ValueError, match="floor=3 ceiling=2"):
        PoolSpec(3, 2)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_actions_that_can_never_run_are_refused(policy):
    s = Scheduler(policy, fixed(2), mem_budget_mb=512)
    with pytest.raises(ValueError, match="'big' needs 600 MB, more than the memory budget of 512 MB"):
        s.submit(act("big", mem=600), 0.0)
    with pytest.raises(ValueError, match="'wide' needs 3 cpu units, more than the cpu pool's ceiling of 2"):
        s.submit(act("wide", cpu=3), 0.0)
    with pytest.raises(
        ValueError, match="'judge' needs 1 accel units, more than the accel pool's ceiling of 0"
    ):
        s.submit(act("judge", cpu=0, accel=1), 0.0)
    with pytest.raises(ValueError, match="must ask for a cpu or accel unit"):
        s.submit(act("nothing", cpu=0), 0.0)
    s.submit(act("ok"), 0.0)
    with pytest.raises(ValueError, match="'ok' was already submitted"):
        s.submit(act("ok"), 0.0)
    with pytest.raises(ValueError, match="'ghost' is not running"):
        s.finish("ghost", 0.0, run_s=1.0)
    assert s.stats(0.0)["queued"] == 1


def test_static_bundle_must_fit_the_pools():
    s = Scheduler("static", {"cpu": PoolSpec(0, 0), "accel": PoolSpec(0, 1)}, mem_budget_mb=512)
    with pytest.raises(ValueError, match="static bundle of action 'j' needs 1 cpu units"):
        s.submit(act("j", cpu=0, accel=1), 0.0)


def test_fifo_head_of_line_blocks_behind_a_two_unit_action():
    s = Scheduler("fifo", fixed(2), mem_budget_mb=1000)
    s.submit(act("a"), 0.0)
    assert ids(s.dispatch(0.0)) == ["a"]
    s.submit(act("b", 0.1, cpu=2), 0.1)
    s.submit(act("c", 0.2), 0.2)
    assert s.dispatch(0.2) == []  # one unit is free, but c waits behind b
    s.finish("a", 1.0, run_s=1.0)
    assert ids(s.dispatch(1.0)) == ["b"]
    s.finish("b", 2.0, run_s=1.0)
    assert ids(s.dispatch(2.0)) == ["c"]


def test_fifo_allocates_the_ceiling_from_the_first_submit():
    s = Scheduler("fifo", {"cpu": PoolSpec(0, 3)}, mem_budget_mb=1000)
    assert s.pool_size("cpu") == 0
    s.submit(act("a", 2.0), 2.0)
    assert s.pool_size("cpu") == 3
    st = s.stats(4.0)
    assert st["cpu_allocated_unit_s"] == 6.0 and st["cpu_peak_units"] == 3


def test_elastic_two_unit_head_reserves_units_against_later_small_ones():
    s = Scheduler("elastic", fixed(2), mem_budget_mb=1000)
    s.submit(act("x1"), 0.0)
    s.submit(act("x2"), 0.0)
    assert ids(s.dispatch(0.0)) == ["x1", "x2"]
    s.submit(act("big", 0.1, cpu=2), 0.1)
    s.submit(act("small", 0.5), 0.5)
    s.finish("x1", 1.0, run_s=1.0)
    assert s.dispatch(1.0) == []  # the free unit is kept for big
    s.finish("x2", 1.5, run_s=1.5)
    assert ids(s.dispatch(1.5)) == ["big"]


def test_elastic_judge_is_not_blocked_by_a_waiting_code_run():
    s = Scheduler("elastic", fixed(1, accel=1), mem_budget_mb=1000)
    s.submit(act("run"), 0.0)
    s.submit(act("wait", 0.1), 0.1)
    s.submit(act("judge", 0.2, cpu=0, accel=1, mem=0, kind="judge"), 0.2)
    assert ids(s.dispatch(0.2)) == ["run", "judge"]


def teach(s: Scheduler, kind: str, run_s: float, t: float) -> float:
    """Run one action of `kind` for `run_s` through `s` so its predictor learns; returns the end time."""
    s.submit(act(f"teach-{kind}-{t}", t, kind=kind), t)
    assert len(s.dispatch(t)) == 1
    s.finish(f"teach-{kind}-{t}", t + run_s, run_s=run_s)
    return t + run_s


@pytest.mark.parametrize("with_history", [False, True])
def test_elastic_runs_a_short_action_before_a_long_one_queued_earlier(with_history):
    s = Scheduler("elastic", fixed(1), mem_budget_mb=1000)
    t = 0.0
    if with_history:
        t = teach(s, "slow", 5.0, t)
        t = teach(s, "fast", 0.1, t)
    s.submit(act("blocker", t), t)
    assert ids(s.dispatch(t)) == ["blocker"]
    s.submit(act("long", t + 0.1, kind="slow"), t + 0.1)
    s.submit(act("short", t + 0.2, kind="fast"), t + 0.2)
    s.finish("blocker", t + 1.0, run_s=1.0)
    # No history: both predicted DEFAULT_PRED_S, arrival order. With history: shortest first.
    assert ids(s.dispatch(t + 1.0)) == (["short"] if with_history else ["long"])


def first_start_of_slow(aging_s: float) -> float | None:
    """One unit; a slow action waits while a fast one is submitted every 0.1 s. When does it start?"""
    s = Scheduler("elastic", fixed(1), mem_budget_mb=1000, aging_s=aging_s)
    t = teach(s, "slow", 10.0, 0.0)
    t = teach(s, "fast", 0.1, t)
    s.submit(act("blocker", t), t)
    s.dispatch(t)
    s.submit(act("slow", t, kind="slow"), t)
    begin, running = t, "blocker"
    for i in range(1, 100):
        now = begin + 0.1 * i
        s.submit(act(f"fast{i}", now, kind="fast"), now)
        s.finish(running, now, run_s=0.1)
        (started,) = s.dispatch(now)
        if started.id == "slow":
            return now - begin
        running = started.id
    return None


def test_aging_lets_a_long_action_through_after_waiting():
    # key = submitted + aging_s * p / (p + 1 s): slow (p = 10 s) is at +1.82 s, a fast one
    # (p = 0.1 s) at +0.18 s, so fast ones submitted up to ~1.64 s after slow go before it.
    waited = first_start_of_slow(aging_s=2.0)
    assert waited is not None and 1.5 <= waited <= 1.8
    assert first_start_of_slow(aging_s=1000.0) is None  # without aging it would wait much longer


def test_predictor_calibrates_hints_and_falls_back_to_the_kind_mean():
    p = Predictor()
    assert p.predict("python", 0.4) == 0.4  # no history: the hint as given
    for _ in range(50):
        p.observe("python", hint_s=2.0, run_s=1.0)  # callers guess twice too long
    assert p.predict("python", 0.4) == pytest.approx(0.2)
    assert p.predict("python", None) == pytest.approx(1.0)


def test_elastic_grows_to_the_ceiling_after_start_s_and_shrinks_to_the_floor_after_idle_s():
    s = Scheduler("elastic", {"cpu": PoolSpec(1, 4, idle_s=5.0, start_s=2.0)}, mem_budget_mb=10_000)
    for i in range(6):
        s.submit(act(f"a{i}"), 0.0)
    assert s.dispatch(0.0) == []
    assert s.pool_size("cpu") == 4  # the floor unit and 3 more, all starting
    assert s.next_event(0.0) == 2.0
    assert s.dispatch(1.9) == []
    assert ids(s.dispatch(2.0)) == ["a0", "a1", "a2", "a3"]
    for i in range(4):
        s.finish(f"a{i}", 3.0, run_s=1.0)
    assert ids(s.dispatch(3.0)) == ["a4", "a5"]
    s.finish("a4", 4.0, run_s=1.0)
    s.finish("a5", 4.0, run_s=1.0)
    assert s.dispatch(4.0) == [] and s.pool_size("cpu") == 4
    # Two units idle since 3.0 go at 8.0, one idle since 4.0 at 9.0; the floor keeps the last.
    assert s.next_event(4.0) == 8.0
    s.dispatch(8.5)
    assert s.pool_size("cpu") == 2
    s.dispatch(9.0)
    assert s.pool_size("cpu") == 1 and s.next_event(9.0) is None
    st = s.stats(10.0)
    assert st["cpu_allocated_unit_s"] == pytest.approx(4 * 8 + 2 * 1 + 1 * 1)
    assert st["cpu_busy_unit_s"] == pytest.approx(4 * 1 + 2 * 1)
    assert st["cpu_utilisation"] == pytest.approx(6 / 35)
    assert st["cpu_peak_units"] == 4 and st["queued"] == 0 and st["running"] == 0


def test_static_holds_a_bundle_across_think_time_until_the_trajectory_ends():
    s = Scheduler("static", {"cpu": PoolSpec(0, 1, start_s=0.5)}, mem_budget_mb=1000)
    s.submit(act("a1", traj="A"), 0.0)
    assert s.dispatch(0.0) == [] and s.next_event(0.0) == 0.5  # the bundle warms up
    assert ids(s.dispatch(0.5)) == ["a1"]
    s.submit(act("b1", 0.6, traj="B"), 0.6)
    s.finish("a1", 1.5, run_s=1.0)
    assert s.dispatch(1.5) == []  # A thinks, its bundle stays; B waits for a bundle
    s.submit(act("a2", 5.0, traj="A"), 5.0)
    assert ids(s.dispatch(5.0)) == ["a2"]
    s.finish("a2", 6.0, run_s=1.0)
    assert s.end_trajectory("A", 8.0) == []
    assert s.dispatch(8.0) == [] and s.pool_size("cpu") == 1  # now B's, warming up
    assert ids(s.dispatch(8.5)) == ["b1"]
    st = s.stats(9.0)
    assert st["cpu_allocated_unit_s"] == pytest.approx(9.0)  # 0..8 for A, 8..9 for B
    assert st["cpu_busy_unit_s"] == pytest.approx(1.0 + 1.0 + 0.5)


def test_static_trajectory_outgrowing_its_bundle_swaps_it_for_a_bigger_one():
    s = Scheduler("static", fixed(2, accel=1), mem_budget_mb=1000)
    s.submit(act("a1", traj="A"), 0.0)
    assert ids(s.dispatch(0.0)) == ["a1"] and s.pool_size("cpu") == 1
    s.finish("a1", 1.0, run_s=1.0)
    s.submit(act("a2", 2.0, cpu=2, traj="A"), 2.0)
    s.submit(act("a3", 2.0, cpu=0, accel=1, traj="A"), 2.0)
    assert ids(s.dispatch(2.0)) == ["a2"] and s.pool_size("cpu") == 2
    s.finish("a2", 3.0, run_s=1.0)
    assert ids(s.dispatch(3.0)) == ["a3"]
    assert (s.pool_size("cpu"), s.pool_size("accel")) == (2, 1)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_memory_budget_is_respected(policy):
    s = Scheduler(policy, fixed(4), mem_budget_mb=700)
    for i in range(3):
        s.submit(act(f"m{i}", mem=300), 0.0)
    assert ids(s.dispatch(0.0)) == ["m0", "m1"]
    assert s.stats(0.0)["mem_used_mb"] == 600
    s.finish("m0", 1.0, run_s=1.0)
    assert ids(s.dispatch(1.0)) == ["m2"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_ending_a_trajectory_drops_its_waiting_actions(policy):
    s = Scheduler(policy, fixed(1), mem_budget_mb=1000)
    s.submit(act("busy"), 0.0)
    assert ids(s.dispatch(0.0)) == ["busy"]
    s.submit(act("t1", traj="T"), 0.1)
    s.submit(act("t2", traj="T"), 0.1)
    s.submit(act("u1", traj="U"), 0.2)
    assert ids(s.end_trajectory("T", 0.3)) == ["t1", "t2"]
    s.finish("busy", 1.0, run_s=1.0)
    s.end_trajectory("traj-busy", 1.0)
    assert ids(s.dispatch(1.0)) == ["u1"]
    assert s.stats(1.0)["queued"] == 0


def suite(id: str, parts: int, t: float = 0.0, *, hint: float | None = None, traj: str = "") -> Action:
    return Action(id, "python", Demand(cpu=1, mem_mb=100), traj or f"traj-{id}", t, hint, parts)


@pytest.mark.parametrize("policy", ["static", "fifo"])
def test_rigid_policies_run_a_suites_cases_one_after_another_on_its_units(policy):
    s = Scheduler(policy, fixed(4), mem_budget_mb=1000)
    s.submit(suite("s", 3), 0.0)
    assert ids(s.dispatch(0.0)) == ["s"]  # three units stay free: the suite holds one
    assert s.finish("s", 1.0, run_s=1.0) is False
    assert ids(s.dispatch(1.0)) == ["s"]  # its second case, on the same unit
    assert s.stats(1.0)["mem_used_mb"] == 100
    assert s.finish("s", 2.0, run_s=1.0) is False
    assert ids(s.dispatch(2.0)) == ["s"]
    assert s.finish("s", 3.0, run_s=1.0) is True
    assert s.dispatch(3.0) == [] and s.stats(3.0)["running"] == 0 and s.stats(3.0)["mem_used_mb"] == 0
    with pytest.raises(ValueError, match="'s' is not running"):
        s.finish("s", 3.0, run_s=1.0)


def test_elastic_spreads_a_suite_over_spare_units_and_takes_them_back_at_case_boundaries():
    s = Scheduler("elastic", fixed(3), mem_budget_mb=1000)
    s.submit(suite("s", 5), 0.0)
    assert ids(s.dispatch(0.0)) == ["s", "s", "s"]  # three cases at once on the idle pool
    assert s.stats(0.0)["mem_used_mb"] == 300
    s.submit(act("new", 0.5), 0.5)
    assert s.dispatch(0.5) == []  # no unit free: the new action waits for a case to end
    assert s.finish("s", 1.0, run_s=1.0) is False
    assert ids(s.dispatch(1.0)) == ["new"]  # the waiting action goes before the suite's next case
    assert s.finish("s", 1.5, run_s=1.5) is False
    assert ids(s.dispatch(1.5)) == ["s"]  # 4th case
    assert s.finish("new", 1.6, run_s=1.1) is True
    assert ids(s.dispatch(1.6)) == ["s"]  # 5th case on the freed unit
    for t in (2.0, 2.5):
        assert s.finish("s", t, run_s=1.0) is False
        assert s.dispatch(t) == []
    assert s.finish("s", 3.0, run_s=1.0) is True
    assert s.stats(3.0)["mem_used_mb"] == 0 and s.stats(3.0)["finished"] == 2
    # The predictor learned the suite's whole run time (its cases' sum), apart from single runs.
    assert s.predictor.predict("python-suite", None) == pytest.approx(5.5)
    assert s.predictor.predict("python", None) == pytest.approx(1.1)


def test_elastic_suite_keeps_one_unit_and_respects_a_reservation():
    s = Scheduler("elastic", fixed(2), mem_budget_mb=1000)
    s.submit(act("a"), 0.0)
    s.submit(suite("s", 4, 0.1), 0.1)
    assert ids(s.dispatch(0.1)) == ["a", "s"]
    s.submit(act("big", 0.2, cpu=2), 0.2)
    assert s.finish("a", 1.0, run_s=1.0) is True
    assert s.dispatch(1.0) == []  # the free unit is reserved for big, not given to the suite
    assert s.finish("s", 1.2, run_s=1.0) is False
    assert ids(s.dispatch(1.2)) == ["s"]  # its last running case ended: the next starts on its unit
    assert s.stats(1.2)["running"] == 1


def test_elastic_grows_the_pool_for_a_suites_cases():
    s = Scheduler("elastic", {"cpu": PoolSpec(1, 4, start_s=0.5)}, mem_budget_mb=1000)
    s.submit(suite("s", 6, hint=6.0), 0.0)
    assert s.dispatch(0.0) == []  # the floor unit is still starting
    assert s.pool_size("cpu") == 4  # grown for its cases, up to the ceiling
    assert ids(s.dispatch(0.5)) == ["s"] * 4


def test_suites_need_at_least_one_part():
    s = Scheduler("elastic", fixed(1), mem_budget_mb=1000)
    with pytest.raises(ValueError, match="needs parts >= 1"):
        s.submit(suite("s", 0), 0.0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_suite_of_an_ended_trajectory_starts_no_more_cases(policy):
    s = Scheduler(policy, fixed(4), mem_budget_mb=1000)
    s.submit(suite("s", 6, traj="t"), 0.0)
    started = len(s.dispatch(0.0))  # 1 (static, fifo) or 4 (elastic)
    assert s.end_trajectory("t", 0.5) == []  # nothing waiting; the suite runs
    done = [s.finish("s", 1.0 + i, run_s=1.0) for i in range(started)]
    assert done == [False] * (started - 1) + [True]  # its running cases finish it, no new ones
    assert s.dispatch(9.0) == [] and s.unstarted_units == {"cpu": 0, "accel": 0}
    st = s.stats(9.0)
    assert st["running"] == 0 and st["failed"] == 1 and st["mem_used_mb"] == 0
    assert s.predictor.mean_s == {}  # a suite cut short teaches nothing


def test_suites_and_single_runs_are_predicted_apart():
    s = Scheduler("elastic", fixed(4), mem_budget_mb=1000)
    s.submit(suite("s", 2), 0.0)
    s.submit(act("one"), 0.0)
    s.dispatch(0.0)
    for t, id in ((1.0, "s"), (1.0, "one"), (2.0, "s")):
        s.finish(id, t, run_s=t)
    assert s.predictor.predict("python", None) == 1.0
    assert s.predictor.predict("python-suite", None) == 3.0
