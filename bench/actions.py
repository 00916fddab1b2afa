"""Action-level scheduling benchmark (issue 9): one RL-shaped action trace against `static`, `fifo`
and `elastic`, on the real actions service and in the simulator.

    python bench/actions.py                 # both modes -> bench/results/actions.{json,md}
    python bench/actions.py --help

**Real mode**: a nats-server, the actions service with real sandboxes (bubblewrap where installed)
and a real judge (the embedded engine on the project's tiny model, batched), and the trace replayed
by agents through the SDK (`ep.act`): waves of trajectories at step boundaries, LLM think time
between actions (sleeps: the benchmark measures the external resources, not the LLM). A python
action's code sleeps for its trace run time: on a 2-core machine, units (warm sandbox workers), not
cores, are the resource being scheduled; worker start-up, sandboxing and NATS hops are real.

**Simulation mode**: the same scheduler code in virtual time (`bench/actions_simulate.py`) at
10,000 concurrent trajectories and 1,000 units.

Pools, the same for every policy of a mode: `fifo` and `elastic` get `--units` CPU units and
`--slots` judge slots (their peak); `static` gets what the common practice provisions, one bundle
per trajectory of a wave (`--trajectories` CPU units and judge slots).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actions_simulate import SimResult, percentile, simulate
from actions_trace import TrajectorySpec, Turn, make_trace
from benchutil import RESULTS, machine

from swarmrl.machine import describe
from swarmrl.schemas import ActionRequest, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.actions.scheduler import PoolSpec

POLICIES = ("static", "fifo", "elastic")
MEM_MB = 1 << 20  # memory is not the constraint studied here


def pools_for(policy: str, units: int, slots: int, trajectories: int, idle_s: float) -> dict[str, PoolSpec]:
    if policy == "static":
        return {"cpu": PoolSpec(0, trajectories), "accel": PoolSpec(0, trajectories)}
    floor_cpu, floor_accel = (units, slots) if policy == "fifo" else (1, 1)
    return {
        "cpu": PoolSpec(floor_cpu, units, idle_s=idle_s, start_s=0.05),
        "accel": PoolSpec(floor_accel, slots, idle_s=idle_s, start_s=0.0),
    }


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
        "makespan_s": round(sum(makespans), 3), "step_makespan_s": [round(m, 3) for m in makespans],
        "wall_s": round(time.monotonic() - t0, 1),
    }  # fmt: skip
    for r in ("cpu", "accel"):
        row[f"{r}_unit_s"] = round(stats[f"{r}_allocated_unit_s"], 1)
        row[f"{r}_busy_unit_s"] = round(stats[f"{r}_busy_unit_s"], 1)
        row[f"{r}_utilisation"] = round(stats[f"{r}_utilisation"], 4)
        row[f"{r}_peak_units"] = int(stats[f"{r}_peak_units"])
    return row


TRACES = {"rigid": False, "suites": True}
"""The two traces of every mode: `rigid` (every action one run) and `suites` (each trajectory ends
with its reward, a test suite whose cases elastic may run in parallel)."""


async def run_real(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    from localstack import embedded_engine

    from swarmrl.bootstrap import build_model

    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-actions-") as d:
        tmp = Path(d)
        build_model(tmp / "judge-model", seed=0, warm_start_steps=0)
        with embedded_engine(tmp / "judge-model", max_batch=max(args.slots, 16)) as (_, url):
            for name, suites in TRACES.items():
                trace = make_trace(args.seed, steps=args.steps, trajectories_per_step=args.trajectories,
                                   reward_suite=suites)  # fmt: skip
                out[name] = []
                for policy in POLICIES:
                    print(f"real {name}: {policy} ...", flush=True)
                    out[name].append(await replay(trace, policy, args, tmp / name, url))
    return out


# --- simulation mode ----------------------------------------------------------------------------


def run_sim(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for name, suites in TRACES.items():
        trace = make_trace(args.seed, steps=args.sim_steps, trajectories_per_step=args.sim_trajectories,
                           reward_suite=suites)  # fmt: skip
        out[name] = []
        for policy in POLICIES:
            pools = pools_for(policy, args.sim_units, args.sim_slots, args.sim_trajectories, args.idle_s)
            res: SimResult = simulate(trace, policy, pools, mem_budget_mb=MEM_MB)
            out[name].append(res.summary())
            print(
                f"sim {name}: {policy} mean ACT {res.mean_act_s:.3f} s, wall {res.wall_s:.1f} s", flush=True
            )
    return out


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


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    by = {r["policy"]: r for r in rows}
    e, f, s = by["elastic"], by["fifo"], by["static"]
    units = lambda r: r["cpu_unit_s"] + r["accel_unit_s"]  # noqa: E731
    return {
        "elastic_over_fifo_mean_act": round(e["mean_act_s"] / f["mean_act_s"], 3),
        "elastic_over_static_unit_s": round(units(e) / units(s), 3),
        "elastic_over_static_makespan": round(e["makespan_s"] / s["makespan_s"], 3),
        "elastic_over_static_mean_act": round(e["mean_act_s"] / s["mean_act_s"], 3),
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| policy | actions | mean ACT s | p50 s | p99 s | mean queued s | makespan s | CPU unit-s | "
        "judge slot-s | CPU util | judge util | peak CPU units | peak judge slots |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['policy']} | {r['actions']} | {r['mean_act_s']:.3f} | {r['p50_act_s']:.3f} | "
            f"{r['p99_act_s']:.3f} | {r['mean_wait_s']:.3f} | {r['makespan_s']:.1f} | {r['cpu_unit_s']:.0f} | "
            f"{r['accel_unit_s']:.0f} | {r['cpu_utilisation']:.1%} | {r['accel_utilisation']:.1%} | "
            f"{r['cpu_peak_units']} | {r['accel_peak_units']} |"
        )
    return out


def targets(q: dict[str, float]) -> list[str]:
    checks = [
        ("elastic mean ACT <= 0.5x fifo's (same peak units)", q["elastic_over_fifo_mean_act"] <= 0.5),
        ("elastic unit-seconds <= 0.4x static's", q["elastic_over_static_unit_s"] <= 0.4),
        ("elastic makespan no worse than static's", q["elastic_over_static_makespan"] <= 1.0),
    ]
    return [f"- {name}: **{'yes' if ok else 'NO'}**" for name, ok in checks]


TRACE_TEXT = {
    "rigid": "every action is one run",
    "suites": "every trajectory ends with its reward, a test suite of 2 + geometric cases (mean 8, "
    "lognormal 0.1 s median each) that fifo and static run one after another on the suite's unit and "
    "elastic may spread over spare units",
}


def section(title: str, rows: list[dict[str, Any]], q: dict[str, float], about: str) -> list[str]:
    return [
        title,
        "",
        about,
        "",
        *table(rows),
        "",
        f"elastic / fifo mean ACT **{q['elastic_over_fifo_mean_act']}x**; elastic / static unit-seconds "
        f"**{q['elastic_over_static_unit_s']}x**, makespan {q['elastic_over_static_makespan']}x, "
        f"mean ACT {q['elastic_over_static_mean_act']}x.",
        "",
        *targets(q),
        "",
    ]


def write(out: dict[str, Any], path: Path) -> None:
    path.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    a = out["args"]
    lines = [
        "# Action-level scheduling: static vs fifo vs elastic",
        "",
        f"{describe(out['machine'])}. Command: `{out['command']}`; {out['wall_s']:.0f} s.",
        "",
        "RL-shaped traces (`bench/actions_trace.py`, seed "
        f"{a['seed']}): waves of trajectories at step boundaries, each a few turns of LLM think time "
        "then one action; python actions with lognormal (heavy-tailed) run times, 20% judge calls. "
        "Two traces: *rigid*, " + TRACE_TEXT["rigid"] + "; *suites*, " + TRACE_TEXT["suites"] + ". "
        "ACT = action completion time (arrival to result). Unit-seconds = units allocated x time "
        "(static: the bundles trajectories hold; fifo: the whole pool; elastic: the pool as it "
        "grows and shrinks); utilisation = busy / allocated.",
        "",
    ]
    for name in TRACES:
        if "real" in out:
            lines += section(
                f"## Real service, {name} trace ({a['steps']} steps x {a['trajectories']} trajectories, "
                f"time scale {a['time_scale']})",
                out["real"][name], out["real_ratios"][name],
                f"The actions service with {out['sandbox_mode']} sandboxes and the batched judge on the "
                f"embedded engine; agents through the SDK. fifo and elastic: {a['units']} CPU units and "
                f"{a['slots']} judge slots at most; static: one bundle per trajectory ({a['trajectories']}).",
            )  # fmt: skip
        if "sim" in out:
            lines += section(
                f"## Simulation, {name} trace ({a['sim_steps']} steps x {a['sim_trajectories']} "
                f"trajectories, {a['sim_units']} CPU units, {a['sim_slots']} judge slots)",
                out["sim"][name], out["sim_ratios"][name],
                "The same scheduler code in virtual time (`bench/actions_simulate.py`); simulation "
                "wall seconds (static, fifo, elastic): "
                + ", ".join(f"{r['wall_s']:.1f}" for r in out["sim"][name]) + ".",
            )  # fmt: skip
    path.with_suffix(".md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="trace seed")
    p.add_argument("--steps", type=int, default=3, help="real mode: RL steps (waves)")
    p.add_argument("--trajectories", type=int, default=48, help="real mode: trajectories per step")
    p.add_argument("--units", type=int, default=4, help="real mode: CPU units of fifo and elastic")
    p.add_argument("--slots", type=int, default=2, help="real mode: judge slots of fifo and elastic")
    p.add_argument("--time-scale", type=float, default=1.0, help="real mode: multiply think and run times")
    p.add_argument("--idle-s", type=float, default=2.0, help="elastic: release a unit idle this long")
    p.add_argument("--sim-steps", type=int, default=3)
    p.add_argument("--sim-trajectories", type=int, default=10_000)
    p.add_argument("--sim-units", type=int, default=1_000)
    p.add_argument("--sim-slots", type=int, default=250)
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
        "command": "python bench/actions.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "args": vars(args) | {"out": str(args.out)},
    }
    if not args.skip_real:
        from swarmrl.services.actions.sandbox import detect_mode

        out["sandbox_mode"] = detect_mode()
        out["real"] = asyncio.run(run_real(args))
        out["real_ratios"] = {name: ratios(rows) for name, rows in out["real"].items()}
    if not args.skip_sim:
        out["sim"] = run_sim(args)
        out["sim_ratios"] = {name: ratios(rows) for name, rows in out["sim"].items()}
    out["wall_s"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(out, args.out)
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
