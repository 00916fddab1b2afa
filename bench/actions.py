"""Action-level scheduling benchmark (issues 9 and 25): one RL-shaped action trace against the two
common practices (`static`, `isolated`), `fifo` and `elastic`, all at the same peak units, on the
real actions service and in the simulator.

    python bench/actions.py                 # both modes -> bench/results/actions.{json,md}
    python bench/actions.py --help

**Real mode**: a nats-server, the actions service with real sandboxes (bubblewrap where installed)
and a real judge (the embedded engine on the project's tiny model, batched), and the trace replayed
by agents through the SDK (`ep.act`): waves of trajectories at step boundaries, LLM think time
between actions (sleeps: the benchmark measures the external resources, not the LLM). A python
action's code sleeps for its trace run time: on a 2-core machine, units (warm sandbox workers), not
cores, are the resource being scheduled; worker start-up, sandboxing and NATS hops are real.

**Simulation mode**: the same scheduler code in virtual time (`tests/support/actions_simulate.py`) at
10,000 concurrent trajectories and 1,000 units, plus a sweep of pool sizes: the units each
baseline needs to reach elastic's mean ACT.

Policies, every one given the same peak units (`--units` CPU units and `--slots` judge slots):

- `static`: trajectory-level bundles from a pool of that size. A trajectory takes its bundle (its
  first action's demand, at least one cpu) when its first action arrives and holds it, idle while
  the LLM thinks, until it ends; trajectories queue first come first served for a bundle, and that
  wait is part of their first action's ACT. A trajectory whose action outgrows its bundle (a 2-cpu
  run, a judge call) gives it back and queues again for one covering both (`scheduler.py`).
- `isolated`: per-task pools, each `fifo`: the units split between the trace's task kinds in
  proportion to each kind's demand over the whole trace (`actions_simulate.split_pools`); a
  single-task trace has one pool, so there it is `fifo`. Simulator only (the service has one pool).
- `fifo`: one shared fixed pool, arrival order. `elastic`: action-level orchestration.
- `static-unbounded` (simulator, for reference): the `static` of issue 9, a bundle for every
  trajectory of a wave (`--sim-trajectories` CPU units and judge slots), i.e. far more units.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine

from swarmrl.machine import describe
from swarmrl.schemas import ActionRequest, encode
from swarmrl.schemas import subjects as S
from tests.support.actions_simulate import (
    CPU_START_S,
    SimResult,
    floor_reached_at,
    percentile,
    pools_for,
    simulate,
    smallest_reaching,
    split_pools,
)
from tests.support.actions_trace import TaskKind, TrajectorySpec, Turn, make_trace

REAL_POLICIES = ("static", "fifo", "elastic")
SIM_POLICIES = ("static", "isolated", "fifo", "elastic", "static-unbounded")
BASELINES = ("static", "isolated", "fifo")
"""What elastic is compared with at equal units, and swept for the units it needs."""
MEM_MB = 1 << 20  # memory is not the constraint studied here
FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0)
"""The pool sizes of the units sweep, as multiples of elastic's units and slots."""
REACH_TOL = 0.02
"""A pool size reaches elastic's mean ACT when within this fraction of it: below a few percent the
difference is the warm-up of units, not queueing."""
VERSION = 2
"""Of the results' layout: 2 since every policy has the same peak units (issue 25)."""
PAPER = {"act": 4.3, "step": 1.5, "saved": 0.712}
"""ARL-Tangram's headline numbers (average ACT, RL step time, external resources saved)."""


def sim_run(
    trace: list[TrajectorySpec], policy: str, units: int, slots: int, trajectories: int, idle_s: float
) -> SimResult:
    """`policy` on `trace` in the simulator with these units (see `pools_for`)."""
    pools = pools_for(policy, units, slots, trajectories, idle_s)
    task_pools = split_pools(trace, pools) if policy == "isolated" else None
    scheduler_policy = "static" if policy == "static-unbounded" else policy
    res = simulate(trace, scheduler_policy, pools, mem_budget_mb=MEM_MB, task_pools=task_pools)
    res.policy = policy
    return res


# --- real mode ----------------------------------------------------------------------------------


def python_code(run_s: float) -> str:
    return f"import time\nt = time.monotonic()\nsum(range(2000))\ntime.sleep(max({run_s:.4f} - (time.monotonic() - t), 0))\nprint('done')"


def python_payload(turn: Turn, scale: float) -> dict[str, Any]:
    """A single run, or (a reward suite) one case per part: each sleeps its trace run time."""
    if len(turn.parts) == 1:
        return {"code": python_code(turn.run_s * scale)}
    return {"code": "", "cases": [python_code(s * scale) for s in turn.parts]}


async def replay(
    trace: list[TrajectorySpec], policy: str, args: argparse.Namespace, tmp: Path, engine: str
) -> dict[str, Any]:
    from swarmrl.agents.sdk import SwarmClient
    from swarmrl.infra.nats_server import NatsServer
    from swarmrl.services.actions.config import ActionsConfig
    from swarmrl.services.actions.service import ActionsService
    from swarmrl.services.common import bus

    pools = pools_for(policy, args.units, args.slots, args.trajectories, args.idle_s)
    with NatsServer(store_dir=tmp / f"nats-{policy}") as server:
        nc = await bus.connect(server.service_url, "bench-actions")
        js = nc.jetstream()
        await bus.ensure_streams(js)
        cfg = ActionsConfig(
            nats=server.service_url, policy=policy,  # type: ignore[arg-type]
            cpu_floor=pools["cpu"].floor, cpu_ceiling=pools["cpu"].ceiling,
            accel_floor=pools["accel"].floor, accel_ceiling=pools["accel"].ceiling,
            mem_budget_mb=MEM_MB, idle_s=args.idle_s, judge_engine=engine, wall_s=60.0, cpu_s=60.0,
        )  # fmt: skip
        service = ActionsService(cfg, nc, js)
        task = asyncio.create_task(service.run())
        await asyncio.sleep(0.5)
        client = await SwarmClient.connect(server.agent, code_version="bench")
        results: list[Any] = []
        makespans: list[float] = []
        t0 = time.monotonic()

        async def trajectory(tr: TrajectorySpec) -> None:
            ep = client.episode(tr.id, episode_id=f"agent_{tr.id.replace('/', '-')}")
            for turn in tr.turns:
                await asyncio.sleep(turn.think_s * args.time_scale)
                if turn.kind == "python":
                    payload = python_payload(turn, args.time_scale)
                    res = await ep.act("python", payload, cpu=turn.demand.cpu, mem_mb=turn.demand.mem_mb,
                                       hint_s=turn.hint_s and turn.hint_s * args.time_scale, timeout_s=120)  # fmt: skip
                else:
                    payload = {"prompt": "Is 7 * 4 + 8 = 36? Answer:", "text": " yes, it is 36."}
                    res = await ep.act("judge", payload, cpu=0, accel=1, mem_mb=1,
                                       hint_s=turn.hint_s and turn.hint_s * args.time_scale)  # fmt: skip
                results.append(res)
            await asyncio.sleep(tr.final_think_s * args.time_scale)
            end = ActionRequest(op="end", action_id="end", episode_id=ep.episode_id)
            await client.nc.publish(S.act_subject("agent"), encode(end))

        for step in sorted({tr.step for tr in trace}):
            began = time.monotonic()
            await asyncio.gather(*(trajectory(tr) for tr in trace if tr.step == step))
            makespans.append(time.monotonic() - began)
            print(f"  {policy}: step {step} took {makespans[-1]:.1f} s", flush=True)
        stats = service.scheduler.stats(time.monotonic())
        service.request_stop()
        await task
        await client.close()
        await nc.close()
    acts = [r.act_s for r in results]
    bad = [r for r in results if r.status != "ok"]
    row: dict[str, Any] = {
        "policy": policy, "actions": len(results), "not_ok": len(bad),
        "not_ok_examples": [f"{r.kind} {r.status}: {r.error[:120]}" for r in bad[:3]],
        "mean_act_s": round(sum(acts) / len(acts), 4), "p50_act_s": round(percentile(acts, 0.5), 4),
        "p99_act_s": round(percentile(acts, 0.99), 4),
        "mean_wait_s": round(sum(r.queued_s for r in results) / len(results), 4),
        "makespan_s": round(sum(makespans), 3), "mean_step_s": round(sum(makespans) / len(makespans), 3),
        "step_makespan_s": [round(m, 3) for m in makespans],
        "wall_s": round(time.monotonic() - t0, 1),
    }  # fmt: skip
    for r in ("cpu", "accel"):
        row[f"{r}_unit_s"] = round(stats[f"{r}_allocated_unit_s"], 1)
        row[f"{r}_busy_unit_s"] = round(stats[f"{r}_busy_unit_s"], 1)
        row[f"{r}_utilisation"] = round(stats[f"{r}_utilisation"], 4)
        row[f"{r}_peak_units"] = int(stats[f"{r}_peak_units"])
    return row


TASKS = (TaskKind("tool", 1.0, 0.1, False), TaskKind("code", 1.0, 0.3, True))
"""The `tasks` trace's two task kinds: an agentic tool-use task (python tool calls, a few judge
calls, no reward suite) and a coding task (more judge calls, and a reward suite at its end)."""
TRACES: dict[str, dict[str, Any]] = {"rigid": {}, "suites": {"reward_suite": True}, "tasks": {"tasks": TASKS}}
"""The traces of every mode (`make_trace` arguments): `rigid` (every action one run), `suites`
(each trajectory ends with its reward, a test suite whose cases elastic may run in parallel) and
`tasks` (the two task kinds of `TASKS`, half the trajectories each: what `isolated` splits by)."""


async def run_real(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    from swarmrl.bootstrap import build_model
    from tests.support.localstack import embedded_engine

    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-actions-") as d:
        tmp = Path(d)
        build_model(tmp / "judge-model", seed=0, warm_start_steps=0)
        with embedded_engine(tmp / "judge-model", max_batch=max(args.slots, 16)) as (_, url):
            for name in args.traces:
                trace = make_trace(args.seed, steps=args.steps, trajectories_per_step=args.trajectories,
                                   **TRACES[name])  # fmt: skip
                out[name] = []
                for policy in REAL_POLICIES:
                    print(f"real {name}: {policy} ...", flush=True)
                    out[name].append(await replay(trace, policy, args, tmp / name, url))
    return out


# --- simulation mode ----------------------------------------------------------------------------


def run_sim(args: argparse.Namespace) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Every policy at equal units on each trace, then the units sweep of each baseline."""
    out: dict[str, list[dict[str, Any]]] = {}
    sweeps: dict[str, dict[str, Any]] = {}
    for name in args.traces:
        trace = make_trace(args.seed, steps=args.sim_steps, trajectories_per_step=args.sim_trajectories,
                           **TRACES[name])  # fmt: skip
        out[name] = []
        for policy in SIM_POLICIES:
            res = sim_run(trace, policy, args.sim_units, args.sim_slots, args.sim_trajectories, args.idle_s)
            out[name].append(res.summary())
            print(
                f"sim {name}: {policy} mean ACT {res.mean_act_s:.3f} s, wall {res.wall_s:.1f} s", flush=True
            )
        if not args.no_units_sweep:
            elastic = next(r for r in out[name] if r["policy"] == "elastic")
            sweeps[name] = {p: units_needed(trace, p, elastic, args) for p in BASELINES}
    return out, sweeps


def units_needed(
    trace: list[TrajectorySpec], policy: str, elastic: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """The smallest pool (a multiple in `FACTORS` of elastic's units and slots) at which `policy`'s
    mean ACT is within `REACH_TOL` of elastic's (its summary row); a pool too small for the trace's
    largest action (or a task's share of it) counts as never reaching it. Units saved compare with
    the units elastic held at its peak (at most the ones it was given)."""

    def size(f: float) -> tuple[int, int]:
        return math.ceil(args.sim_units * f), math.ceil(args.sim_slots * f)

    def mean_act_at(f: float) -> float:
        try:
            res = sim_run(trace, policy, *size(f), args.sim_trajectories, args.idle_s)
        except ValueError:  # the pools cannot hold some action: that size never reaches anything
            return math.inf
        print(
            f"  units sweep {policy} x{f}: mean ACT {res.mean_act_s:.3f} s, wall {res.wall_s:.1f} s",
            flush=True,
        )
        return res.mean_act_s

    factor, tried = smallest_reaching(mean_act_at, elastic["mean_act_s"] * (1 + REACH_TOL), FACTORS)
    # Never reached: elastic beats the best this policy gets with any units (its mean ACT floor).
    # The units at which it reaches that floor are then a lower bound on the units it needs.
    reached = factor is not None
    at = factor if factor is not None else floor_reached_at(tried, REACH_TOL)
    cpu, slots = size(at)
    given = elastic["cpu_peak_units"] + elastic["accel_peak_units"]
    return {
        "reached": reached, "factor": at, "cpu_units": cpu, "slots": slots,
        "saved": round(1 - given / (cpu + slots), 4), "best_act_s": round(min(tried.values()), 4),
        "tried": {str(f): round(a, 4) for f, a in tried.items()},
    }  # fmt: skip


SWEEP = [  # (trajectories per wave, CPU units, python sigma, think sigma, reward suites)
    (24, 4, 1.1, 0.6, False), (48, 4, 1.1, 0.6, False), (96, 4, 1.1, 0.6, False), (192, 4, 1.1, 0.6, False),
    (48, 4, 1.1, 0.1, False), (48, 8, 1.1, 0.1, False), (96, 2, 1.1, 0.6, False), (96, 4, 1.5, 0.6, False),
    (96, 4, 2.0, 0.6, False), (192, 4, 2.0, 0.6, False),
    (48, 4, 1.1, 0.6, True), (48, 8, 1.1, 0.6, True), (48, 16, 1.1, 0.6, True), (96, 8, 1.1, 0.6, True),
    (96, 16, 1.1, 0.6, True), (192, 16, 1.1, 0.6, True),
]  # fmt: skip


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """fifo vs elastic (and the bound no scheduler beats: ACT >= run time) over loads and tails."""
    rows = []
    for traj, units, sigma, think_sigma, suites in SWEEP:
        trace = make_trace(args.seed, steps=3, trajectories_per_step=traj, python_sigma=sigma,
                           think_sigma=think_sigma, reward_suite=suites)  # fmt: skip
        res = {
            pol: simulate(
                trace, pol, pools_for(pol, units, args.slots, traj, args.idle_s), mem_budget_mb=MEM_MB
            )
            for pol in ("fifo", "elastic")
        }
        f, e = res["fifo"], res["elastic"]
        mean_run = f.mean_act_s - sum(f.wait_s) / len(f.wait_s)
        busy = sum(f.busy_unit_s.values()) / max(sum(f.allocated_unit_s.values()), 1e-9)
        rows.append({
            "trajectories": traj, "units": units, "python_sigma": sigma, "think_sigma": think_sigma,
            "reward_suites": suites,
            "fifo_mean_act_s": f.mean_act_s, "elastic_mean_act_s": e.mean_act_s, "mean_run_s": mean_run,
            "fifo_utilisation": busy, "elastic_over_fifo": e.mean_act_s / f.mean_act_s,
            "bound_over_fifo": mean_run / f.mean_act_s,
        })  # fmt: skip
        print(f"sweep: {traj} traj / {units} units sigma {sigma}: elastic/fifo {rows[-1]['elastic_over_fifo']:.3f}",
              flush=True)  # fmt: skip
    return rows


def sweep_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "## Simulator sweep: where can elastic halve fifo's mean ACT?",
        "",
        "fifo and elastic at the same peak units over loads (trajectories per wave over units), tails "
        "(sigma of the python run time) and wave sharpness (sigma of the think time). *bound* is the mean "
        "run time over fifo's mean ACT: no scheduler's mean ACT is below the mean run time, so elastic "
        "can reach 0.5x only where fifo's mean wait is at least its mean run time. That needs a pool "
        "saturated for a while, and there a closed loop (each trajectory waits for its action, then "
        "thinks again) binds the other way: the pool completes actions at its capacity in any order, "
        "so by Little's law the mean of think + ACT per action is nearly fixed. Ordering (shortest "
        "predicted first) only lets the trajectories with short actions cycle faster. The *suites* "
        "rows break the bound where units are spare: a reward suite's cases run in parallel, so its "
        "ACT can be below its (sequential) run time.",
        "",
        "| trace | trajectories | units | run sigma | think sigma | fifo util | fifo mean ACT s "
        "| elastic mean ACT s | mean run s | elastic / fifo | bound / fifo |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {'suites' if r['reward_suites'] else 'rigid'} | {r['trajectories']} | {r['units']} | "
            f"{r['python_sigma']} | {r['think_sigma']} | "
            f"{r['fifo_utilisation']:.0%} | {r['fifo_mean_act_s']:.3f} | {r['elastic_mean_act_s']:.3f} | "
            f"{r['mean_run_s']:.3f} | **{r['elastic_over_fifo']:.3f}** | {r['bound_over_fifo']:.3f} |"
        )
    return [*out, ""]


# --- report -------------------------------------------------------------------------------------


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each other policy over elastic at equal units: mean and p99 ACT, mean step time; and the
    unit-seconds elastic saves (1 - elastic's / the other's)."""
    by = {r["policy"]: r for r in rows}
    e = by["elastic"]
    units = lambda r: r["cpu_unit_s"] + r["accel_unit_s"]  # noqa: E731
    return {
        p: {
            "mean_act": round(by[p]["mean_act_s"] / e["mean_act_s"], 3),
            "p99_act": round(by[p]["p99_act_s"] / e["p99_act_s"], 3),
            "step": round(by[p]["mean_step_s"] / e["mean_step_s"], 3),
            "unit_s_saved": round(1 - units(e) / units(by[p]), 4),
        }
        for p in by
        if p != "elastic"
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| policy | actions | mean ACT s | p50 s | p99 s | mean queued s | mean step s | CPU unit-s | "
        "judge slot-s | CPU util | judge util | peak CPU units | peak judge slots |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['policy']} | {r['actions']} | {r['mean_act_s']:.3f} | {r['p50_act_s']:.3f} | "
            f"{r['p99_act_s']:.3f} | {r['mean_wait_s']:.3f} | {r['mean_step_s']:.1f} | {r['cpu_unit_s']:.0f} | "
            f"{r['accel_unit_s']:.0f} | {r['cpu_utilisation']:.1%} | {r['accel_utilisation']:.1%} | "
            f"{r['cpu_peak_units']} | {r['accel_peak_units']} |"
        )
    return out


def paper_table(q: dict[str, dict[str, float]], sweep: dict[str, Any] | None) -> list[str]:
    """Each policy over elastic next to ARL-Tangram's "up to" numbers."""
    out = [
        f"| vs elastic | mean ACT / elastic's (paper: up to {PAPER['act']}x) | p99 ACT / elastic's | "
        f"step time / elastic's (paper: up to {PAPER['step']}x) | unit-s elastic saves, equal units | "
        f"units to reach elastic's mean ACT | units elastic saves (paper: up to {PAPER['saved']:.1%}) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p, r in q.items():
        need, saved = "not swept", ""
        if sweep is not None and p in sweep:
            s = sweep[p]
            need = f"{s['factor']}x ({s['cpu_units']} CPU + {s['slots']} slots)"
            saved = f"{s['saved']:.1%}"
            if not s["reached"]:  # see units_needed
                need = f"never (best {s['best_act_s']:.3f} s, from {need})"
                saved = f">= {saved}"
        out.append(
            f"| {p} | **{r['mean_act']}x** | {r['p99_act']}x | **{r['step']}x** | {r['unit_s_saved']:.1%} | "
            f"{need} | {saved} |"
        )
    return out


TRACE_TEXT = {
    "rigid": "every action is one run",
    "suites": "every trajectory ends with its reward, a test suite of 2 + geometric cases (mean 8, "
    "lognormal 0.1 s median each) that fifo and static run one after another on the suite's unit and "
    "elastic may spread over spare units",
    "tasks": "two task kinds, half the trajectories each: *tool* (10% judge calls, no suite) and "
    "*code* (30% judge calls, ends with a reward suite)",
}


def section(
    title: str,
    rows: list[dict[str, Any]],
    q: dict[str, dict[str, float]],
    about: str,
    sweep: dict[str, Any] | None,
) -> list[str]:
    lines = [title, "", about, "", *table(rows), "", *paper_table(q, sweep), ""]
    if sweep:
        lines += [
            "Units sweep: mean ACT at each pool size tried (multiples of elastic's units and slots), "
            f"up to the first within {REACH_TOL:.0%} of elastic's (or until more units stop helping); "
            "units saved = 1 - elastic's peak units (CPU + slots) / the units needed. *never*: no pool size reaches "
            "elastic's mean ACT, the policy's best is above it (with suites, elastic runs a suite's "
            "cases in parallel, which no rigid policy does at any size; static also pays a bundle's "
            f"warm-up, {CPU_START_S} s, for every trajectory and every swap for a bigger bundle); the "
            "units at which it reaches its own best are then a lower bound on what it needs.",
            "",
            *(
                f"- {p}: " + ", ".join(f"x{f} {a:.3f} s" for f, a in s["tried"].items())
                for p, s in sweep.items()
            ),
            "",
        ]
    return lines


def write(out: dict[str, Any], path: Path) -> None:
    path.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    a = out["args"]
    lines = [
        "# Action-level scheduling at equal units: static vs isolated vs fifo vs elastic",
        "",
        f"{describe(out['machine'])}. Command: `{out['command']}`; {out['wall_s']:.0f} s."
        + "".join(f" The {part} sections: `{cmd}`, run before." for part, cmd in out.get("kept", {}).items()),
        "",
        "RL-shaped traces (`tests/support/actions_trace.py`, seed "
        f"{a['seed']}): waves of trajectories at step boundaries, each a few turns of LLM think time "
        "then one action; python actions with lognormal (heavy-tailed) run times, 20% judge calls. "
        "Traces: " + "; ".join(f"*{n}*, {TRACE_TEXT[n]}" for n in a["traces"]) + ". "
        "ACT = action completion time (arrival to result, including any wait for a bundle). Step = "
        "rollout-step time, from a wave's start until its last trajectory ends (mean over steps). "
        "Unit-seconds = units allocated x time (static: the bundles trajectories hold; fifo, isolated: "
        "the whole pools; elastic: the pool as it grows and shrinks); utilisation = busy / allocated.",
        "",
        "Every policy but `static-unbounded` gets the same peak units. `static`: a trajectory holds a "
        "bundle from that pool from its first action to its end; trajectories queue for bundles (FIFO). "
        "`isolated`: one fifo pool per task kind, the units split in proportion to each kind's demand "
        "(run seconds x units) over the trace; on a single-task trace it is fifo. `static-unbounded`: "
        "a bundle for every trajectory of a wave (issue 9's static). See `bench/actions.py`'s docstring.",
        "",
    ]
    for name in TRACES:
        if name in out.get("real", {}):
            ra = out.get("real_args", a)
            lines += section(
                f"## Real service, {name} trace ({ra['steps']} steps x {ra['trajectories']} trajectories, "
                f"time scale {ra['time_scale']})",
                out["real"][name], out["real_ratios"][name],
                f"The actions service with {out['sandbox_mode']} sandboxes and the batched judge on the "
                f"embedded engine; agents through the SDK; every policy {ra['units']} CPU units and "
                f"{ra['slots']} judge slots at most (isolated needs a pool per task: simulator only).",
                None,
            )  # fmt: skip
        if name in out.get("sim", {}):
            sa = out.get("sim_args", a)
            lines += section(
                f"## Simulation, {name} trace ({sa['sim_steps']} steps x {sa['sim_trajectories']} "
                f"trajectories, {sa['sim_units']} CPU units, {sa['sim_slots']} judge slots)",
                out["sim"][name], out["sim_ratios"][name],
                "The same scheduler code in virtual time (`tests/support/actions_simulate.py`); simulation "
                "wall seconds (" + ", ".join(r["policy"] for r in out["sim"][name]) + "): "
                + ", ".join(f"{r['wall_s']:.1f}" for r in out["sim"][name]) + ".",
                out["sim_sweep"].get(name),
            )  # fmt: skip
    path.with_suffix(".md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="trace seed")
    p.add_argument("--steps", type=int, default=3, help="real mode: RL steps (waves)")
    p.add_argument("--trajectories", type=int, default=48, help="real mode: trajectories per step")
    p.add_argument("--units", type=int, default=4, help="real mode: CPU units of every policy")
    p.add_argument("--slots", type=int, default=2, help="real mode: judge slots of every policy")
    p.add_argument("--time-scale", type=float, default=1.0, help="real mode: multiply think and run times")
    p.add_argument("--idle-s", type=float, default=2.0, help="elastic: release a unit idle this long")
    p.add_argument("--sim-steps", type=int, default=3)
    p.add_argument("--sim-trajectories", type=int, default=10_000)
    p.add_argument("--sim-units", type=int, default=1_000)
    p.add_argument("--sim-slots", type=int, default=250)
    p.add_argument("--traces", nargs="+", choices=list(TRACES), default=list(TRACES))
    p.add_argument("--no-units-sweep", action="store_true", help="simulation: skip the sweep of pool sizes")
    p.add_argument("--skip-real", action="store_true")
    p.add_argument("--skip-sim", action="store_true")
    p.add_argument("--sweep", action="store_true",
                   help="only the simulator sweep over loads and tails -> <out>-sweep.{json,md}")  # fmt: skip
    p.add_argument("--out", type=Path, default=RESULTS / "actions")
    args = p.parse_args(argv)
    started = time.monotonic()
    if args.sweep:
        rows = run_sweep(args)
        path = args.out.with_name(args.out.name + "-sweep")
        path.with_suffix(".json").write_text(
            json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n"
        )
        head = ["# Action scheduling sweep (simulator)", "", f"{describe(machine())}. Command: `python "
                f"bench/actions.py --sweep`; {time.monotonic() - started:.0f} s.", ""]  # fmt: skip
        path.with_suffix(".md").write_text("\n".join(head + sweep_lines(rows)))
        return 0
    out: dict[str, Any] = {
        "benchmark": "actions",
        "version": VERSION,
        "command": "python bench/actions.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "args": vars(args) | {"out": str(args.out)},
    }
    # A part skipped now keeps its sections from an earlier run into the same OUT (the real service
    # and the simulator are often run apart: the first wants an idle machine, the second does not).
    earlier_path = args.out.with_suffix(".json")
    earlier = json.loads(earlier_path.read_text()) if earlier_path.exists() else {}
    if earlier.get("version") != VERSION:
        earlier = {}  # another benchmark's policies: nothing to keep
    kept = [
        part
        for part, skipped in (("real", args.skip_real), ("sim", args.skip_sim))
        if skipped and part in earlier
    ]
    for part in kept:
        keys = (
            ("sandbox_mode", "real", "real_ratios", "real_args")
            if part == "real"
            else ("sim", "sim_sweep", "sim_ratios", "sim_args")
        )
        out.update({k: earlier[k] for k in keys if k in earlier})
        out.setdefault("kept", {})[part] = earlier.get("kept", {}).get(part, earlier["command"])
    if not args.skip_real:
        from swarmrl.services.actions.sandbox import detect_mode

        out["sandbox_mode"] = detect_mode()
        out["real"] = asyncio.run(run_real(args))
        out["real_args"] = out["args"]
        out["real_ratios"] = {name: ratios(rows) for name, rows in out["real"].items()}
    if not args.skip_sim:
        out["sim"], out["sim_sweep"] = run_sim(args)
        out["sim_args"] = out["args"]
        out["sim_ratios"] = {name: ratios(rows) for name, rows in out["sim"].items()}
    out["wall_s"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(out, args.out)
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
