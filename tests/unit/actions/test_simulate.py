"""The trace generator and the virtual-time simulator, driving the real scheduler."""

import pytest

from swarmrl.services.actions.scheduler import PoolSpec
from tests.support.actions_simulate import percentile, simulate
from tests.support.actions_trace import make_trace

MEM = 64_000


def pools(cpu: int, accel: int) -> dict[str, PoolSpec]:
    return {
        "cpu": PoolSpec(0, cpu, idle_s=5.0, start_s=0.5),
        "accel": PoolSpec(0, accel, idle_s=5.0, start_s=0.5),
    }


@pytest.fixture(scope="module")
def results():
    """The default trace at a moderate scale where the pools are contended (300 trajectories a step
    for 16 cpu units and 4 accel slots), under each policy."""
    trace = make_trace(0, steps=2, trajectories_per_step=300)
    return trace, {
        p: simulate(trace, p, pools(16, 4), mem_budget_mb=MEM) for p in ("static", "fifo", "elastic")
    }


def test_trace_has_the_rollout_shape():
    trace = make_trace(7, steps=3, trajectories_per_step=200)
    assert [sum(tr.step == k for tr in trace) for k in range(3)] == [200, 200, 200]
    turns = [turn for tr in trace for turn in tr.turns]
    judges = [t for t in turns if t.kind == "judge"]
    python = [t for t in turns if t.kind == "python"]
    assert 0.15 < len(judges) / len(turns) < 0.25
    assert all(t.demand.accel == 1 and t.demand.cpu == 0 and 0.1 <= t.run_s <= 0.3 for t in judges)
    assert all(t.demand.cpu in (1, 2) and 128 <= t.demand.mem_mb <= 512 for t in python)
    runs = sorted(t.run_s for t in python)
    assert 0.05 < percentile(runs, 0.2) and percentile(runs, 0.8) < 0.5  # most are short
    assert runs[-1] > 3.0  # and a tail
    assert 4.0 < len(turns) / len(trace) < 8.0
    assert all(t.hint_s is not None and t.hint_s > 0 for t in turns)


def test_same_seed_same_trace_and_result():
    assert make_trace(3, steps=2, trajectories_per_step=50) == make_trace(
        3, steps=2, trajectories_per_step=50
    )
    assert make_trace(3, steps=2, trajectories_per_step=50) != make_trace(
        4, steps=2, trajectories_per_step=50
    )
    trace = make_trace(3, steps=2, trajectories_per_step=50)
    a, b = (simulate(trace, "elastic", pools(4, 1), mem_budget_mb=MEM).summary() for _ in range(2))
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_every_action_runs_once_and_steps_are_waves(results):
    trace, by_policy = results
    n_actions = sum(len(tr.turns) for tr in trace)
    # A step lasts at least as long as its longest trajectory with no waiting at all.
    floor = [
        max(sum(t.think_s + t.run_s for t in tr.turns) + tr.final_think_s for tr in trace if tr.step == k)
        for k in range(2)
    ]
    busy_cpu = sum(t.run_s * t.demand.cpu for tr in trace for t in tr.turns)
    for r in by_policy.values():
        assert len(r.act_s) == len(r.wait_s) == n_actions
        assert len(r.step_makespan_s) == 2 and r.makespan_s == pytest.approx(sum(r.step_makespan_s))
        assert all(m <= r.makespan_s for m in r.step_makespan_s)
        assert all(m >= f - 1e-9 for m, f in zip(r.step_makespan_s, floor, strict=True))
        assert r.busy_unit_s["cpu"] == pytest.approx(busy_cpu)
        assert r.busy_unit_s["cpu"] <= r.allocated_unit_s["cpu"] + 1e-6
        assert r.peak_units["cpu"] <= 16 and r.peak_units["accel"] <= 4


def test_elastic_beats_fifo_on_act_and_static_on_unit_seconds(results):
    _, r = results
    assert r["elastic"].mean_act_s < r["fifo"].mean_act_s
    assert r["elastic"].p50_act_s < r["fifo"].p50_act_s
    for res in ("cpu", "accel"):
        assert r["elastic"].allocated_unit_s[res] < r["fifo"].allocated_unit_s[res]
        assert r["elastic"].allocated_unit_s[res] < r["static"].allocated_unit_s[res]
    assert r["static"].makespan_s > r["fifo"].makespan_s  # trajectories wait for bundles


def test_static_with_a_bundle_per_trajectory_still_costs_more_unit_seconds():
    trace = make_trace(1, steps=1, trajectories_per_step=100)
    static = simulate(trace, "static", pools(200, 100), mem_budget_mb=MEM)
    elastic = simulate(trace, "elastic", pools(200, 100), mem_budget_mb=MEM)
    assert static.allocated_unit_s["cpu"] > 3 * elastic.allocated_unit_s["cpu"]
    assert static.utilisation["cpu"] < elastic.utilisation["cpu"]


def test_reward_suites_end_every_trajectory_and_elastic_spreads_their_cases():
    trace = make_trace(2, steps=2, trajectories_per_step=48, reward_suite=True)
    assert all(len(tr.turns[-1].parts) >= 2 and tr.turns[-1].kind == "python" for tr in trace)
    assert all(tr.turns[-1].run_s == pytest.approx(sum(tr.turns[-1].parts)) for tr in trace)
    assert all(len(t.parts) == 1 for tr in trace for t in tr.turns[:-1])
    by = {p: simulate(trace, p, pools(8, 2), mem_budget_mb=MEM) for p in ("static", "fifo", "elastic")}
    busy_cpu = sum(t.run_s * t.demand.cpu for tr in trace for t in tr.turns)
    suites = [tr.turns[-1].run_s for tr in trace]
    for r in by.values():
        assert len(r.act_s) == len(r.wait_s) == sum(len(tr.turns) for tr in trace)  # each action once
        assert r.busy_unit_s["cpu"] == pytest.approx(busy_cpu)  # and each case once
    # fifo runs a suite's cases one after another (the longest takes at least its sum); elastic
    # runs them on spare units, which cuts the tail and the mean.
    assert max(by["fifo"].act_s) >= max(suites) - 1e-9
    assert max(by["elastic"].act_s) < 0.8 * max(by["fifo"].act_s)
    assert by["elastic"].p99_act_s < 0.8 * by["fifo"].p99_act_s
    assert by["elastic"].mean_act_s < 0.85 * by["fifo"].mean_act_s
    assert by["elastic"].peak_units["cpu"] <= 8
