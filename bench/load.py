"""Load test of the swarm's data path: many lightweight agents, ramped until a bound is hit.

    python bench/load.py [--replicas 1,2] [--stage-s 45] [--max-agents 4096] [--procs 8] [--out bench/results]
    python bench/load.py --quick          # smoke test: a tiny ramp, a couple of minutes

For each replica count (`--replicas 1,2`: one run after the other, side by side in one result):

1. Starts the services as `swarmrl up` does, as separate processes: NATS (its own store, per-role
   users, monitoring on), then `plan_services` of a swarm built here (the `tiny` preset, task
   `calculator` with `clients = 0`, `[run] actions = "off"`, `[replicas]` = the count for merger,
   gateway, ledger and engine), without the trainer: nothing consumes SAMPLES but the ledger, so the
   gateway's admission control (on, at its default bound) finds no trainer backlog and admits every
   group, and no training competes for the CPUs.
2. Starts `--procs` load processes (`bench/load.py --agent-proc`), each with its own NATS identity
   (`AgentIds.mint`, a connect file, as `up`'s clients) and ONE `SwarmClient`, running many agent
   coroutines. An agent loops: open a training episode (GRPO group key shared with the other
   `num_repeat - 1` agents of its team, round by round, so groups fill), make `--calls` chat
   completions through `ep.openai()` (`--max-tokens`, real engine; no retries unless
   `--openai-retries`, so every failed attempt shows), publish a reward, end. Each
   process appends its calls and episodes (wall-clock stamps) to a JSON-lines file the parent reads.
3. Ramps: stages of increasing total agents (`--stages`, up to `--max-agents`), `--stage-s` each,
   figures taken over the stage's last two thirds (last half with thinking agents, below). The ramp stops at a bound: calls/s grew less than
   10% over the previous stage while p99 call latency is above `--p99-bound-s`; errors on more than
   1% of the calls or episodes; a service exited; or the last stage.
4. Meanwhile it samples, every second: CPU of every process (/proc: services, NATS, load
   processes) and of the machine, each engine's `/engine_stats` (queued, running, tokens), every
   JetStream consumer (`consumers_info`: delivered and pending per consumer; merger replica r owns
   `merger-p<p>-r` on EPISODE_PARTS, a ledger replica `ledger-p<p>-r` on LEDGER_PARTS and, holding
   lease 16, `ledger-<stream>`; the one ledger `ledger-<stream>`), and NATS `/varz` (messages, CPU).
   Events/s per merger and per ledger replica are the deltas of their consumers' delivered counts.
5. After the last stage the agents finish their episodes, the pipeline drains, the services stop
   (the ledger last) and the ledger's Parquet files are counted against what the agents ended.

Thinking agents (`--think-median-s`, e.g. 60): before each call an agent waits a lognormal time of
that median (`--think-sigma`), as tools and environments take, so what the services hold is open
episodes rather than calls in flight; `--clients-per-proc` spreads them over more `SwarmClient`
connections (each its own NATS identity). Every stage then also records the open episodes and each
process's resident memory, and the report fits memory per open episode and per connection for every
service (`load_crowd.py`) and sizes `--paper-agents` (default 100,000) such agents on paper.

    python bench/load.py --think-median-s 60 --calls 4 --procs 8 --clients-per-proc 25 \
        --stages 500,1000,2000,3000 --stage-s 240

Writes `<out>/load.json` and `<out>/load.md`: per replica count and stage, episodes/s, LLM calls/s,
p50/p99 latency of a call as the agent sees it (through the gateway, engine included), events/s per
merger and ledger replica, CPU per process, the first bottleneck (the earliest stage where a queue
or a saturated process shows, with the evidence), and what 10,000 agents would need, computed on
paper from the per-process figures, the arithmetic shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# The load processes' code is in load_agents.py; the stage figures and the results are in load_report.py.
from load_agents import MODEL, TASK, agent_proc
from load_probe import Probe, Records
from load_report import caveat, figures, first_bottleneck, report, signals, write_report

SERVICES = ("gateway", "engine", "merger", "ledger")
QUICK = {"stages": "8,32", "stage_s": 15.0, "procs": 2, "drain_s": 30.0}
"""What `--quick` changes: a tiny ramp."""
SCRIPT = Path(__file__).resolve()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchutil import RESULTS

    p = argparse.ArgumentParser(
        prog="bench/load.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--replicas", default="1,2", help="replica counts of every service to run, one after the other")
    add("--stages", default="16,64,256,1024,2048,4096", help="total agents per ramp stage")
    add("--max-agents", type=int, default=4096, help="no stage beyond this many agents")
    add("--stage-s", type=float, default=45.0, help="seconds per stage (figures over its last two thirds)")
    add("--procs", type=int, default=8, help="load processes (each one SwarmClient, many agents)")
    add("--calls", type=int, default=2, help="chat completions per episode")
    add("--think-median-s", type=float, default=0.0,
        help="thinking agents: before each call a lognormal wait of this median (0: none, calls back to back)")  # fmt: skip
    add("--think-sigma", type=float, default=0.5, help="the think time's lognormal sigma")
    add(
        "--ramp-s",
        type=float,
        default=30.0,
        help="thinking agents: a stage's new agents begin over this long",
    )
    add("--clients-per-proc", type=int, default=1,
        help="SwarmClient connections per load process, each its own NATS identity (a team shares one)")  # fmt: skip
    add("--max-tokens", type=int, default=4, help="max_tokens of every call")
    add(
        "--gateway",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [gateway] setting of the swarm (repeatable), e.g. engine_max_inflight=0",
    )
    add("--p99-bound-s", type=float, default=2.0, help="p99 call latency that, with calls/s flat, is a bound")
    add("--call-timeout-s", type=float, default=120.0, help="a call slower than this is an error")
    add("--openai-retries", type=int, default=0,
        help="max_retries of each episode's OpenAI client (the SDK's default is 2); 0: every failed attempt "
        "counts as an error, none is hidden in the latency")  # fmt: skip
    add("--drain-s", type=float, default=60.0, help="after the ramp, how long agents may finish episodes")
    add("--model", type=Path, default=None, help="HF model dir (default: the cached `tiny` preset)")
    add("--work-dir", type=Path, default=None, help="NATS store, run dirs, logs (default runs/load-<time>)")
    add("--out", type=Path, default=RESULTS, help="where load.json and load.md go")
    add("--name", default="load", help="results file name")
    add("--paper-agents", type=int, default=0,
        help="agents of the swarm sized on paper (default 10,000; with thinking agents 100,000)")  # fmt: skip
    add("--paper-call-interval-s", type=float, default=5.0,
        help="on paper: seconds between an agent's LLM calls (a real agent thinks and generates more)")  # fmt: skip
    add("--paper-node-cores", type=int, default=8, help="on paper: cores of one NATS node")
    add("--quick", action="store_true", help="smoke test: --stages 8,32 --stage-s 15 --procs 2 --drain-s 30 "
        "(flags given win)")  # fmt: skip
    # the load process (started by the parent; its code is in load_agents.py)
    add("--agent-proc", default="", help=argparse.SUPPRESS)
    add("--control", type=Path, default=None, help=argparse.SUPPRESS)
    add("--records", type=Path, default=None, help=argparse.SUPPRESS)
    add("--num-repeat", type=int, default=8, help=argparse.SUPPRESS)
    if p.parse_args(argv).quick:
        p.set_defaults(**QUICK)
    args = p.parse_args(argv)
    args.paper_agents = args.paper_agents or (100_000 if args.think_median_s > 0 else 10_000)
    return args


# -- the parent: services, ramp, probes -------------------------------------------------------------


def model_path(args: argparse.Namespace) -> Path:
    """`--model`, else the cached `tiny` preset; never builds one (a build takes minutes of 2 cores)."""
    if args.model is not None:
        return args.model.resolve()
    from swarmrl.bootstrap import ensure_model, model_dir

    if not (model_dir("tiny") / "meta.json").exists():
        raise SystemExit(f"no cached `tiny` model at {model_dir('tiny')}: run `just up` once (it builds it) "
                         "or give --model DIR")  # fmt: skip
    return ensure_model("tiny", progress=False)


def build_swarm(n: int, model: Path, args: argparse.Namespace) -> tuple[Any, dict[str, int]]:
    from swarmrl.swarm import Replicas, build

    want = dict.fromkeys(SERVICES, n)
    # Only the fields this Replicas has: the gateway/ledger/engine ones landed after merger's.
    applied = {k: v for k, v in want.items() if k in Replicas.model_fields}
    data = {
        "models": {MODEL: {"base": str(model)}},
        "tasks": {TASK: {"clients": 0}},
        "run": {"actions": "off", "max_tokens": args.max_tokens},
        "replicas": applied,
    }
    if args.gateway:
        data["gateway"] = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.gateway)}
    return build(data, "bench/load.py"), applied


def bound(f: dict[str, Any], prev: dict[str, Any] | None, args: argparse.Namespace) -> str:
    if f["error_rate"] > 0.01:
        return f"errors on {100 * f['error_rate']:.1f}% of calls and episodes ({f['error_examples']})"
    if prev and f["calls_per_s"] < 1.1 * prev["calls_per_s"] and (f["call_p99_s"] or 0) > args.p99_bound_s:
        return (f"calls/s {prev['calls_per_s']} -> {f['calls_per_s']} (<10% gain) with p99 "
                f"{f['call_p99_s']} s > {args.p99_bound_s:g} s")  # fmt: skip
    return ""


def stage_line(n: int, f: dict[str, Any]) -> str:
    ev = ", ".join(f"{k} {v:g}" for k, v in f["events_per_s"].items())
    return (f"load: replicas={n} agents={f['agents']} open={f['open_episodes']:g}: {f['episodes_per_s']} ep/s, "
            f"{f['calls_per_s']} calls/s, p50 {f['call_p50_s']} s p99 {f['call_p99_s']} s, begin p99 {f['begin_p99_s']} s, "
            f"errors {f['errors']}; events/s {ev}; MiB {f['memory_mib']}")  # fmt: skip


def targets(total: int, procs: list[str], team: int) -> dict[str, int]:
    """Agents per load process: whole teams (GRPO groups fill), spread round robin."""
    out = dict.fromkeys(procs, 0)
    for t in range(math.ceil(total / team)):
        out[procs[t % len(procs)]] += team
    return out


async def wait_ready(js: Any, http: Any, urls: list[str], merger: bool, ledger_parts: bool, sup: Any) -> None:
    """Every gateway and engine answers /health, every episode partition has a merger consumer and
    the ledger consumes (its partitions too, with replicas)."""
    from swarmrl.schemas import subjects as S

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if dead := sup.dead():
            raise RuntimeError(f"services exited before the load began: {dead} (logs in {sup.log_dir})")
        ok = True
        for url in urls:
            try:
                ok &= (await http.get(f"{url}/health", timeout=3)).status_code == 200
            except Exception:
                ok = False
        names = {c.name for c in await js.consumers_info(S.EPISODE_PARTS_STREAM)}
        ok &= not merger or sum(n.startswith("merger-p") for n in names) == S.EPISODE_PARTITIONS
        ledger = {c.name for c in await js.consumers_info(S.SAMPLES_STREAM)}
        ok &= "ledger-samples" in ledger
        if ledger_parts:
            parts = {c.name for c in await js.consumers_info(S.LEDGER_PARTS_STREAM)}
            ok &= sum(n.startswith("ledger-p") for n in parts) == S.EPISODE_PARTITIONS
        if ok:
            return
        await asyncio.sleep(1.0)
    raise TimeoutError(f"services not ready after 300 s (logs in {sup.log_dir})")


async def run_one(n: int, args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """One replica count: start, ramp, drain, stop, count the ledger."""
    import httpx

    from swarmrl.infra.credentials import AgentRegistry
    from swarmrl.infra.nats_server import NatsServer, free_port
    from swarmrl.launch import AgentIds, plan_services, spawn_services
    from swarmrl.services.common import bus
    from swarmrl.supervisor import Supervisor

    swarm, applied = build_swarm(n, model, args)
    run_dir, logs = work / "run", work / "logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    mon = free_port()
    server = NatsServer(
        store_dir=work / "nats", log_file=logs / "nats.log", extra_args=["-m", str(mon)]
    ).start()
    sup = Supervisor(logs)
    ledger_parts = getattr(swarm.replicas, "ledger", 1) > 1
    try:
        nc = await bus.connect(server.service_url, "bench-load")
        js = nc.jetstream()
        await bus.ensure_streams(js, ledger_parts=ledger_parts)
        planned = plan_services(swarm, {MODEL: model}, run_dir)
        procs = [p for p in planned if p.service in SERVICES]  # the trainer left out
        spawn_services(sup, procs, run_dir, server.service_url, server.role_urls)
        engines = {p.name: _url(p.config) for p in procs if p.service == "engine"}
        gateways = [_url(p.config) for p in procs if p.service == "gateway"]
        async with httpx.AsyncClient() as http:
            await wait_ready(js, http, [*engines.values(), *gateways], True, ledger_parts, sup)
            assert server.proc is not None
            probe = Probe(
                js, http, {**sup.pids(), "nats": server.proc.pid}, engines, f"http://127.0.0.1:{mon}/varz"
            )
            names = [f"load-{i}" for i in range(args.procs)]
            idle = probe.memory() | {"@nats_connections": await probe.connections()}
            conns = {n: [f"{n}-c{j}" for j in range(args.clients_per_proc)] for n in names}
            ids = AgentIds(AgentRegistry(server.conf_dir), server.service_url, swarm, run_dir)
            files = ids.mint([c for cs in conns.values() for c in cs])
            control, recdir = work / "control.json", work / "records"
            recdir.mkdir(exist_ok=True)
            team = swarm.num_repeat(TASK)
            for name in names:
                argv = [str(SCRIPT), "--agent-proc", name, "--control", str(control),
                        "--records", str(recdir / f"{name}.jsonl"), "--num-repeat", str(team),
                        "--calls", str(args.calls), "--max-tokens", str(args.max_tokens),
                        "--call-timeout-s", str(args.call_timeout_s), "--drain-s", str(args.drain_s),
                        "--openai-retries", str(args.openai_retries), "--think-median-s", str(args.think_median_s),
                        "--think-sigma", str(args.think_sigma), "--ramp-s", str(args.ramp_s)]  # fmt: skip
                env = {
                    "SWARMRL_CONNECT_FILES": json.dumps([str(files[c]) for c in conns[name]]),
                    "PYTHONUNBUFFERED": "1",
                }
                sup.spawn(name, argv, env)
            probe.procs = {**sup.pids(), "nats": server.proc.pid, "bench": os.getpid()}
            pids = probe.procs
            rec = Records([recdir / f"{name}.jsonl" for name in names])
            deadline = time.monotonic() + 180
            while rec.ready < len(names):  # a load process takes seconds to import and connect
                if time.monotonic() > deadline or any(sup.procs[n].poll() is not None for n in names):
                    raise RuntimeError(f"load processes not ready after 180 s or exited (logs in {logs})")
                await asyncio.sleep(0.5)
                rec.read()
            await asyncio.sleep(5.0)  # the new connections settle
            connected = probe.memory() | {"@nats_connections": await probe.connections()}
            stages: list[dict[str, Any]] = []
            stop_reason = "last stage"
            plan = [int(x) for x in args.stages.split(",") if int(x) <= args.max_agents]
            cores = os.cpu_count() or 1
            for i, total in enumerate(plan):
                tg = targets(total, names, team)
                _write_control(control, {"stage": i, "targets": tg, "stop": False})
                t0 = time.time()
                while time.time() < t0 + args.stage_s:
                    await probe.sample()
                    rec.read()
                    await asyncio.sleep(max(0.0, 1.0 - (time.time() % 1.0)))
                await probe.sample()
                rec.read()
                stage = {"agents": sum(tg.values()), "think_median_s": args.think_median_s}
                # thinking agents' first calls come a think after their begin: only the stage's last half is steady
                since = args.stage_s / (2 if args.think_median_s > 0 else 3)
                f = figures(stage, rec, probe, t0 + since, time.time())
                f["signals"] = signals(f, cores)
                f["sockets"] = probe.sockets([n for n in pids if n != "bench"])
                f["caveat"] = caveat(f, cores)
                dead = {k: v for k, v in sup.dead().items() if not k.startswith("load-")}
                f["bound"] = bound(f, stages[-1] if stages else None, args) or (
                    f"exited: {dead}" if dead else ""
                )
                stages.append(f)
                print(stage_line(n, f) + (f"  BOUND: {f['bound']}" if f["bound"] else ""), flush=True)
                for s in [*f["signals"], *([f"caveat: {f['caveat']}"] if f["caveat"] else [])]:
                    print(f"load:   {s}", flush=True)
                if f["bound"]:
                    stop_reason = f["bound"]
                    break
            _write_control(control, {"stage": -1, "targets": {}, "stop": True})
            print(f"load: replicas={n}: ramp stopped ({stop_reason}); draining", flush=True)
            load_procs = [sup.procs[name] for name in names]
            await asyncio.to_thread(_wait_all, load_procs, args.drain_s + 60)
            rec.read()
            settled = await _settle(js, 120)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        sup.stop([p for p in sup.procs if p.split("-")[0] in ("load", "gateway", "engine", "merger")], 30)
        sup.stop([p for p in sup.procs if p.startswith("ledger")], 60)  # last: it takes what the others made
        server.stop()
    return {
        "replicas": n, "replicas_applied": applied, "pids": pids, "stages": stages,
        "idle_memory_mib": idle, "connected_memory_mib": connected, "connections": len(files), "procs": len(names),
        "stop_reason": stop_reason, "first_bottleneck": first_bottleneck(stages),
        "agents_final": _sum(rec.finals), "pipeline_settled": settled, "ledger": ledger_counts(run_dir),
        "work_dir": str(work),
    }  # fmt: skip


def _url(cfg: Any) -> str:
    """Where an engine or gateway process of this machine listens (`plan_services` picked its port)."""
    return f"http://127.0.0.1:{cfg.port}"


def _write_control(path: Path, ctl: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ctl))
    tmp.replace(path)


def _wait_all(procs: list[Any], timeout: float) -> None:
    end = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(timeout=max(0.1, end - time.monotonic()))


def _sum(finals: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {"processes_reported": len(finals)}
    for f in finals:
        for k, v in f.items():
            out[k] = out.get(k, 0) + v
    return out


async def _settle(js: Any, timeout: float) -> bool:
    """Wait until the mergers' and the ledger's consumers hold nothing pending."""
    from swarmrl.schemas import subjects as S

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = 0
        for stream in (S.EPISODE_PARTS_STREAM, S.LEDGER_PARTS_STREAM, *S.STREAM_SUBJECTS):
            with contextlib.suppress(Exception):
                for c in await js.consumers_info(stream):
                    if c.name.startswith(("merger", "ledger")):
                        busy += int(c.num_pending or 0) + int(c.num_ack_pending or 0)
        if busy == 0:
            return True
        await asyncio.sleep(1.0)
    return False


def ledger_counts(run_dir: Path) -> dict[str, Any]:
    """What the ledger wrote: episodes by status, LLM calls, merge stats."""
    import duckdb

    from swarmrl.services.ledger.views import register_views

    with duckdb.connect() as con:
        register_views(con, run_dir)
        status = dict(con.execute("SELECT status, count(*) FROM episodes GROUP BY status").fetchall())
        calls = con.execute("SELECT count(*) FROM llm_calls").fetchone()
    return {"episodes_by_status": status, "llm_calls": int(calls[0]) if calls else 0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.agent_proc:  # a load process, spawned by `run_one`: its code is in load_agents.py
        return asyncio.run(agent_proc(args))
    import datetime as dt
    import shlex

    model = model_path(args)
    work = args.work_dir or Path("runs") / f"load-{dt.datetime.now():%Y%m%d-%H%M%S}"
    runs = []
    for n in [int(x) for x in args.replicas.split(",")]:
        print(f"load: replicas={n}: starting the services (work dir {work / f'replicas-{n}'})", flush=True)
        runs.append(asyncio.run(run_one(n, args, model, (work / f"replicas-{n}").resolve())))
    result = report(runs, args, shlex.join(["bench/load.py", *(sys.argv[1:] if argv is None else argv)]))
    path = write_report(result, args.out, args.name)
    print(f"load: wrote {path} and {args.name}.md", flush=True)
    for ln in result["paper"].get("lines", []):
        print(f"load: paper: {ln}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
