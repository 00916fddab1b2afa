"""The baselines at equal units (issue 25): `static` bundles from a bounded pool, per-task
`isolated` pools, and the sweep of pool sizes. Expected numbers are worked out by hand in comments."""

import math

import pytest

from swarmrl.services.actions.model import Demand
from swarmrl.services.actions.scheduler import PoolSpec
from tests.support.actions_simulate import pools_for, simulate, smallest_reaching, split_pools, split_units
from tests.support.actions_trace import TaskKind, TrajectorySpec, Turn, make_trace

MEM = 64_000
CPU1 = Demand(cpu=1, mem_mb=128)


def one_action(
    tid: str, think_s: float, run_s: float, final_s: float, task: str = "default"
) -> TrajectorySpec:
    return TrajectorySpec(tid, 0, (Turn(think_s, "python", CPU1, (run_s,), run_s),), final_s, task)


# A: submits at 1.0, runs 1.0-3.0, thinks to 4.0, ends.   B: submits 1.5, runs 1.5-2.5, ends at 3.0.
# C: submits at 2.0. Two bundles, both held (A's and B's): C waits until B ends at 3.0 (not until B's
# action is done at 2.5: B's bundle is idle while B thinks, but it is B's), runs 3.0-4.0, ends 4.5.
THREE = [one_action("A", 1.0, 2.0, 1.0), one_action("B", 1.5, 1.0, 0.5), one_action("C", 2.0, 1.0, 0.5)]
TWO_UNITS = {"cpu": PoolSpec(0, 2), "accel": PoolSpec(0, 0)}


def test_static_at_equal_units_makes_the_third_trajectory_wait_for_a_bundle():
    r = simulate(THREE, "static", TWO_UNITS, mem_budget_mb=MEM)
    assert sorted(r.act_s) == pytest.approx([1.0, 2.0, 2.0])  # B 1.0, A 2.0, C 1.0 wait + 1.0 run
    assert sorted(r.wait_s) == pytest.approx([0.0, 0.0, 1.0])
    assert r.mean_act_s == pytest.approx(5.0 / 3.0)
    assert r.step_makespan_s == pytest.approx([4.5]) and r.mean_step_s == pytest.approx(4.5)
    assert r.peak_units["cpu"] == 2
    # Held: A 1.0-4.0, B 1.5-3.0, C 3.0-4.5 = 3 + 1.5 + 1.5 unit-seconds; busy 2 + 1 + 1.
    assert r.allocated_unit_s["cpu"] == pytest.approx(6.0)
    assert r.busy_unit_s["cpu"] == pytest.approx(4.0)


def test_fifo_with_the_same_two_units_starts_the_third_action_when_a_unit_frees():
    r = simulate(THREE, "fifo", {"cpu": PoolSpec(2, 2), "accel": PoolSpec(0, 0)}, mem_budget_mb=MEM)
    # C starts at 2.5, when B's action ends (B then thinks without a unit): ACT 0.5 + 1.0.
    assert sorted(r.act_s) == pytest.approx([1.0, 1.5, 2.0])
    assert r.step_makespan_s == pytest.approx([4.0])  # A ends at 4.0, C at 3.5 + 0.5


def test_static_and_isolated_get_the_units_fifo_and_elastic_get():
    for policy in ("static", "isolated", "fifo", "elastic"):
        p = pools_for(policy, 7, 3, trajectories=500, idle_s=2.0)
        assert (p["cpu"].ceiling, p["accel"].ceiling) == (7, 3), policy
    assert pools_for("static-unbounded", 7, 3, trajectories=500, idle_s=2.0)["cpu"].ceiling == 500


# Task a: two trajectories submitting at 0.5, 1.0 s each. Task b: one, submitting at 10.0.
TWO_TASKS = [
    one_action("a1", 0.5, 1.0, 0.1, "a"),
    one_action("a2", 0.5, 1.0, 0.1, "a"),
    one_action("b1", 10.0, 1.0, 0.1, "b"),
]


def test_isolated_pools_never_lend_units_across_tasks():
    task_pools = {
        "a": {"cpu": PoolSpec(1, 1), "accel": PoolSpec(0, 0)},
        "b": {"cpu": PoolSpec(3, 3), "accel": PoolSpec(0, 0)},
    }
    r = simulate(TWO_TASKS, "isolated", {}, mem_budget_mb=MEM, task_pools=task_pools)
    # a2 waits for a's only unit (0.5 -> 1.5) while b's three sit idle: ACT 2.0.
    assert sorted(r.act_s) == pytest.approx([1.0, 1.0, 2.0])
    assert r.task_peak_units == {"a": {"cpu": 1, "accel": 0}, "b": {"cpu": 3, "accel": 0}}
    assert r.peak_units["cpu"] == 4
    # Both pools are held from the run's first submit (0.5) to b1's end (11.1), b's idle until 10.0.
    assert r.allocated_unit_s["cpu"] == pytest.approx(4 * 10.6)
    assert r.busy_unit_s["cpu"] == pytest.approx(3.0)
    shared = simulate(TWO_TASKS, "fifo", {"cpu": PoolSpec(4, 4), "accel": PoolSpec(0, 0)}, mem_budget_mb=MEM)
    assert sorted(shared.act_s) == pytest.approx([1.0, 1.0, 1.0])


def test_isolated_needs_a_pool_for_every_task():
    with pytest.raises(ValueError, match=r"task_pools for every task of the trace \['a', 'b'\], got \['a'\]"):
        simulate(TWO_TASKS, "isolated", {}, mem_budget_mb=MEM, task_pools={"a": TWO_UNITS})


def test_units_split_in_proportion_to_each_tasks_demand():
    # Demand (run seconds x cpu): a 3.0, b 1.0, so 8 units split 6 / 2.
    trace = [one_action("a1", 0.0, 3.0, 0.0, "a"), one_action("b1", 0.0, 1.0, 0.0, "b")]
    assert split_units(trace, "cpu", 8) == {"a": 6, "b": 2}
    assert split_units(trace, "cpu", 5) == {"a": 4, "b": 1}  # 3.75 / 1.25: the larger remainder
    # A task with little demand still gets its largest action (a 2-cpu run), taken from the other.
    big = TrajectorySpec("b2", 0, (Turn(0.0, "python", Demand(cpu=2), (0.01,), None),), 0.0, "b")
    assert split_units([*trace, big], "cpu", 8) == {"a": 6, "b": 2}
    assert split_units([one_action("a1", 0.0, 30.0, 0.0, "a"), big], "cpu", 4) == {"a": 2, "b": 2}
    with pytest.raises(ValueError, match="2 cpu units cannot hold one action of each task"):
        split_units([one_action("a1", 0.0, 3.0, 0.0, "a"), big], "cpu", 2)
    pools = split_pools(trace, {"cpu": PoolSpec(0, 8, start_s=0.5), "accel": PoolSpec(0, 0)})
    assert pools["a"]["cpu"] == PoolSpec(6, 6, start_s=0.5) and pools["b"]["accel"] == PoolSpec(0, 0)


def test_isolated_on_a_single_task_trace_is_fifo():
    trace = make_trace(5, steps=1, trajectories_per_step=60)
    pools = {"cpu": PoolSpec(4, 4), "accel": PoolSpec(1, 1)}
    iso = simulate(trace, "isolated", pools, mem_budget_mb=MEM, task_pools=split_pools(trace, pools))
    fifo = simulate(trace, "fifo", pools, mem_budget_mb=MEM)
    assert iso.act_s == fifo.act_s and iso.step_makespan_s == fifo.step_makespan_s


def test_mixed_task_trace_draws_each_kind_and_keeps_single_task_traces():
    kinds = (TaskKind("tool", 1.0, 0.0, False), TaskKind("code", 1.0, 1.0, True))
    trace = make_trace(1, steps=1, trajectories_per_step=400, tasks=kinds)
    tool = [tr for tr in trace if tr.task == "tool"]
    code = [tr for tr in trace if tr.task == "code"]
    assert 150 < len(tool) < 250 and len(tool) + len(code) == 400
    assert all(t.kind == "python" and len(t.parts) == 1 for tr in tool for t in tr.turns)
    assert all(len(tr.turns[-1].parts) >= 2 for tr in code)
    assert all(t.kind == "judge" for tr in code for t in tr.turns[:-1])
    assert {tr.task for tr in make_trace(1, steps=1, trajectories_per_step=50)} == {"default"}


def test_units_sweep_answer_is_monotone_in_the_target():
    trace = make_trace(2, steps=1, trajectories_per_step=80)
    factors = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

    def mean_act_at(f: float) -> float:
        pools = {"cpu": PoolSpec(math.ceil(4 * f), math.ceil(4 * f)), "accel": PoolSpec(1, math.ceil(f))}
        return simulate(trace, "fifo", pools, mem_budget_mb=MEM).mean_act_s

    acts = {f: mean_act_at(f) for f in factors}
    answers = []
    for target in sorted(acts.values()):
        f, tried = smallest_reaching(mean_act_at, target, factors, flat=len(factors))
        assert f is not None and tried[f] <= target
        assert all(a > target for g, a in tried.items() if g < f)  # the first that reaches it
        answers.append(f)
    # A looser target never needs more units.
    assert answers == sorted(answers, reverse=True) and answers[0] > answers[-1]


def test_units_sweep_stops_at_the_first_size_that_reaches_or_when_more_stop_helping():
    calls: list[float] = []

    def act(f: float) -> float:
        calls.append(f)
        return {1.0: 5.0, 2.0: 3.0, 3.0: 4.0, 4.0: 2.0, 5.0: 1.0}[f]

    assert smallest_reaching(act, 3.5, (1.0, 2.0, 3.0, 4.0, 5.0))[0] == 2.0 and calls == [1.0, 2.0]
    calls.clear()

    def flat(f: float) -> float:
        calls.append(f)
        return 2.0

    f, tried = smallest_reaching(flat, 1.0, (1, 2, 3, 4, 5, 6), flat=2)
    assert f is None and calls == [1, 2, 3] and tried == {1: 2.0, 2: 2.0, 3: 2.0}
    with pytest.raises(ValueError, match="ascending"):
        smallest_reaching(act, 1.0, (2.0, 1.0))
