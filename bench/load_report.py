"""What `bench/load.py` reports: stage figures, the first bottleneck, load.json, load.md, agents on paper.

`figures` reduces a ramp stage's window of samples (`load.Probe`) and agent records (`load.Records`) to
its figures; `signals` says what in them shows a part at its limit and `caveat` what the rest of the
machine took; `first_bottleneck` is the earliest stage with a signal. `paper` sizes a swarm of
`--paper-agents` agents from the best stage's per-process figures, the arithmetic shown. `report` is
load.json's content, `write_report` writes it and load.md (`write_md`).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from load_probe import Probe, Records

# -- a stage's figures and what they say ------------------------------------------------------------


def owner(key: str, lease16: str) -> tuple[str, str] | None:
    """(service, replica) of a consumer `<stream>/<name>`, None for others (the trainer's, ...)."""
    stream, name = key.split("/", 1)
    if name.startswith("merger-p"):
        return "merger", name.split("-", 2)[2]
    if name.startswith("ledger-p"):  # ledger-p<p>-<replica>-<takeover>: a fresh consumer per takeover
        return "ledger", name.split("-", 2)[2].rsplit("-", 1)[0]
    if name.startswith("ledger-"):
        return "ledger", lease16 or "ledger"
    return None


def _process(service: str, replica: str, procs: dict[str, Any]) -> str:
    """The process name of a replica: `up` names replicas after their processes (`merger-0`); a lone
    replica names itself (host, pid), so it is the service's one process."""
    mine = [n for n in procs if n.split("-")[0] == service]
    return replica if replica in procs or len(mine) != 1 else mine[0]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 4)


def figures(stage: dict[str, Any], rec: Records, probe: Probe, a: float, b: float) -> dict[str, Any]:
    """A stage's figures over its steady window [a, b]."""
    dt = b - a
    calls = [c for c in rec.calls if a <= c[2] <= b]
    eps = [e for e in rec.episodes if a <= e[3] <= b]
    ok_calls = [c for c in calls if c[3]]
    lat = [c[2] - c[1] for c in ok_calls]
    begin = [e[2] - e[1] for e in eps if e[2]]
    s0, s1 = probe.at(a), probe.at(b)
    span = max(s1["t"] - s0["t"], 1e-6)
    cpu = {k: round((s1["cpu"][k] - s0["cpu"].get(k, 0.0)) / span, 3) for k in s1["cpu"] if k in s0["cpu"]}
    if "@machine_busy" in cpu:  # the machine is shared: what the rest of it took
        cpu["@others"] = round(
            cpu["@machine_busy"] - sum(v for k, v in cpu.items() if not k.startswith("@")), 3
        )
    c0, c1 = s0.get("consumers", {}), s1.get("consumers", {})
    lease16 = str(c1.get("@ledger_lease16", {}).get("holder", ""))
    events: dict[str, float] = {}
    lag: dict[str, dict[str, int]] = {}
    for key, v in c1.items():
        who = owner(key, lease16) if not key.startswith("@") else None
        if who is None:
            continue
        before = c0.get(key, {"delivered": 0, "pending": 0, "ack_pending": 0})
        moved = v["delivered"] - before["delivered"]  # < 0: the consumer was made again (rebalance)
        label = f"{who[0]}/{_process(who[0], who[1], probe.procs)}"
        events[label] = events.get(label, 0.0) + (moved if moved >= 0 else v["delivered"])
        # Undelivered messages are the lag; unacked ones are in the service's hands (the merger holds
        # an open episode's events, the ledger a flush's), which is normal.
        d = lag.setdefault(who[0], {"undelivered_start": 0, "undelivered_end": 0, "unacked_end": 0})
        d["undelivered_start"] += int(before["pending"])
        d["undelivered_end"] += int(v["pending"])
        d["unacked_end"] += int(v["ack_pending"])
    window = probe.between(a, b)
    engines: dict[str, Any] = {}
    for name in s1["engines"]:
        seen = [s["engines"][name] for s in window if name in s["engines"]]
        e0, e1 = s0["engines"].get(name, {}), s1["engines"][name]
        steps = e1.get("decode_steps", 0) - e0.get("decode_steps", 0)
        toks = e1.get("tokens_generated", 0) - e0.get("tokens_generated", 0)
        engines[name] = {
            "queued_mean": round(statistics.fmean(x["queued"] for x in seen), 1) if seen else None,
            "running_mean": round(statistics.fmean(x["running"] for x in seen), 1) if seen else None,
            "tokens_per_s": round(toks / span, 1), "tokens_per_decode_step": round(toks / steps, 2) if steps else None,
        }  # fmt: skip
    v0, v1 = s0["varz"], s1["varz"]
    nats = {
        k: round((v1[k] - v0[k]) / span, 1)
        for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")
        if k in v0 and k in v1
    }
    errors = sum(not c[3] for c in calls) + sum(e[4] == "error" for e in eps)
    return {
        **stage, "window_s": round(dt, 1),
        "open_episodes": open_episodes(rec, a, b), "open_episodes_end": open_episodes(rec, b, b),
        "calls": len(ok_calls), "episodes": sum(e[4] == "ended" for e in eps),
        "memory_mib": s1.get("memory", {}),
        "episodes_per_s": round(sum(e[4] == "ended" for e in eps) / dt, 2),
        "calls_per_s": round(len(ok_calls) / dt, 2),
        "call_p50_s": pct(lat, 0.5), "call_p99_s": pct(lat, 0.99),
        "begin_p50_s": pct(begin, 0.5), "begin_p99_s": pct(begin, 0.99),
        "errors": errors, "error_rate": round(errors / max(len(calls) + len(eps), 1), 4),
        "error_examples": sorted({str(e[5]) for e in eps if e[4] == "error"})[:3],
        "events_per_s": {k: round(v / span, 1) for k, v in sorted(events.items())},
        "lag": lag, "cpu_cores": cpu, "engines": engines, "nats_per_s": nats,
    }  # fmt: skip


def open_episodes(rec: Records, a: float, b: float) -> float:
    """Agents with an episode open, summed over the load processes: the mean over [a, b] of each
    second's gauges (a == b: the last gauge of each process at `b`)."""
    if a == b:
        return float(sum(next((n for t, n in reversed(g) if t <= b), 0) for g in rec.gauges.values()))
    per_proc = [
        {int(t): n for t, n in g if a <= t <= b} for g in rec.gauges.values()
    ]  # last gauge per second
    seconds = set.intersection(*(set(d) for d in per_proc)) if per_proc else set()
    return round(statistics.fmean(sum(d[sec] for d in per_proc) for sec in seconds), 1) if seconds else 0.0


def signals(f: dict[str, Any], cores: int) -> list[str]:
    """What in a stage's figures says a part is at its limit (empty: nothing is)."""
    out = []
    for svc, d in f["lag"].items():
        grew = d["undelivered_end"] - d["undelivered_start"]
        rate = sum(v for k, v in f["events_per_s"].items() if k.startswith(f"{svc}/")) * f["window_s"]
        if grew > max(50, 0.05 * rate):
            out.append(f"{svc} falls behind: its consumers' undelivered messages grew "
                       f"{d['undelivered_start']} -> {d['undelivered_end']}")  # fmt: skip
    for name, e in f["engines"].items():
        if e["queued_mean"] and e["queued_mean"] >= 1:
            out.append(f"{name} queues: {e['queued_mean']} requests waiting on average, {e['running_mean']} "
                       f"running, on {f['cpu_cores'].get(name, 0):.2f} cores")  # fmt: skip
    # nats-server is multi-threaded; a service is one asyncio process, rarely idle at 0.8 of a core
    for name, c in f["cpu_cores"].items():
        limit = cores if name == "nats" else 1.0
        if not name.startswith("@") and c >= 0.8 * limit:
            out.append(f"{name} at {c:.2f} cores (its limit {limit:g})")
    busy = f["cpu_cores"].get("@machine_busy", 0.0)
    ours = {n: c for n, c in f["cpu_cores"].items() if not n.startswith("@")}
    if busy >= 0.9 * cores and sum(ours.values()) >= 0.5 * cores:  # else others filled it: `caveat`
        top = sorted(((c, n) for n, c in ours.items()), reverse=True)[:3]
        out.append(f"machine CPU busy {busy:.2f} of {cores} cores, this swarm {sum(ours.values()):.2f} "
                   f"(largest: {', '.join(f'{n} {c:.2f}' for c, n in top)})")  # fmt: skip
    return out


def caveat(f: dict[str, Any], cores: int) -> str:
    """Other processes on the machine took a share of it that the figures lack."""
    others = f["cpu_cores"].get("@others", 0.0)
    if others < 0.25 * cores:
        return ""
    return f"other processes on this machine used {others:.2f} of its {cores} cores during this stage"


def first_bottleneck(stages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest stage with a signal: its agents and the evidence (None: no stage showed one)."""
    s = next((s for s in stages if s["signals"]), None)
    return {"agents": s["agents"], "signals": s["signals"]} if s else None


# -- results ------------------------------------------------------------------------------------------


def best(run: dict[str, Any]) -> dict[str, Any] | None:
    """The stage with the most calls/s (the sustained figures), errors under 1%."""
    ok = [s for s in run["stages"] if s["error_rate"] <= 0.01]
    return max(ok, key=lambda s: s["calls_per_s"], default=None)


def paper(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Processes and NATS nodes for `--paper-agents` agents, from the per-process figures of the best
    stage of the one-replica run (the cleanest per-process measurement), with the arithmetic."""
    run = next((r for r in runs if r["replicas"] == 1), runs[0])
    s = best(run)
    if s is None:
        return {"why": "no stage without errors"}
    agents, rate = args.paper_agents, 1.0 / args.paper_call_interval_s
    demand = agents * rate
    eps_per_call = s["episodes_per_s"] / max(s["calls_per_s"], 1e-9)
    lines, out = [], {"from": f"replicas={run['replicas']}, {s['agents']} agents", "calls_per_s": demand}
    lines.append(f"Demand: {agents} agents x 1/{args.paper_call_interval_s:g} calls/s = {demand:g} LLM calls/s "
                 f"({eps_per_call:.2f} episodes per call measured -> {demand * eps_per_call:g} episodes/s).")  # fmt: skip

    k = demand / max(s["calls_per_s"], 1e-9)  # every service's load grows with the calls

    def per_proc(service: str, load: float, unit: str, aim: float = 0.7) -> None:
        names = [n for n in s["cpu_cores"] if n.split("-")[0] == service]
        cpu = sum(s["cpu_cores"][n] for n in names)
        if not names or cpu <= 0 or load <= 0:
            return
        cap = load / cpu  # per core = per process: a service process works on one core
        need = math.ceil(load * k / (aim * cap))
        out[service] = {"per_core": round(cap, 1), "load": round(load * k, 1), "need": need}
        lines.append(f"{service}: {load:g} {unit}/s on {cpu:.2f} cores measured -> {cap:.1f} {unit}/s per core; "
                     f"{load * k:g} {unit}/s needed; at {aim:.0%} of a core: {load * k:g} / ({aim:g} x {cap:.1f}) "
                     f"= **{need} processes**.")  # fmt: skip

    merger_ev = sum(v for n, v in s["events_per_s"].items() if n.startswith("merger/"))
    ledger_ev = sum(v for n, v in s["events_per_s"].items() if n.startswith("ledger/"))
    lines.append(f"Scale: {demand:g} / {s['calls_per_s']:g} calls/s measured = x{k:.1f} every measured rate. "
                 f"Events per call measured: {merger_ev / max(s['calls_per_s'], 1e-9):.2f} to the mergers, "
                 f"{ledger_ev / max(s['calls_per_s'], 1e-9):.2f} to the ledger (every stream).")  # fmt: skip
    per_proc("gateway", s["calls_per_s"], "calls")
    per_proc("engine", s["calls_per_s"], "calls")
    per_proc("merger", merger_ev, "events")
    per_proc("ledger", ledger_ev, "events")
    agents_per = s["agents"] / max(1, run["replicas"])
    lines.append(f"Measured directly: {s['agents']} agents calling back-to-back (no think time) on "
                 f"{run['replicas']} gateway(s) at p99 {s['call_p99_s']} s -> {agents} / {agents_per:g} = "
                 f"{math.ceil(agents / agents_per)} gateway+engine sets for such agents at that latency; a floor "
                 "for the gateway alone wherever the first bottleneck above is not the gateway.")  # fmt: skip
    nats = s["nats_per_s"]
    msgs = nats.get("in_msgs", 0) + nats.get("out_msgs", 0)
    ncpu = s["cpu_cores"].get("nats", 0.0)
    if msgs and ncpu:
        per_core = msgs / ncpu
        need_msgs = msgs / max(s["calls_per_s"], 1e-9) * demand
        nodes = max(3, math.ceil(need_msgs / (0.5 * per_core * args.paper_node_cores)))
        out["nats"] = {"msgs_per_core": round(per_core), "msgs_per_s": round(need_msgs), "nodes": nodes}
        lines.append(f"NATS: {msgs:g} msgs/s (in + out) on {ncpu:.2f} cores -> {per_core:.0f} msgs/s per core; "
                     f"{msgs / max(s['calls_per_s'], 1e-9):.1f} msgs per call -> {need_msgs:.0f} msgs/s; at half of "
                     f"{args.paper_node_cores}-core nodes: {need_msgs:.0f} / (0.5 x {per_core:.0f} x {args.paper_node_cores}) "
                     f"-> **{nodes} nodes** (3 at least: streams with 3 replicas; measured on one node with 1 "
                     "replica, and replication costs each node more per message).")  # fmt: skip
    out["lines"] = lines
    return out


def run_md(run: dict[str, Any]) -> list[str]:
    """One replica count's section: the stages, CPU per process, signals, bottleneck, accounting."""
    stages = run["stages"]
    lines = ["", f"## {run['replicas']} replica(s) of each service", "",
             f"Replicas applied: {run['replicas_applied']}. Ramp stopped: {run['stop_reason']}.", "",
             "| agents | open episodes | episodes/s | calls/s | call p50 s | call p99 s | begin p50 s | begin p99 s "
             "| errors | events/s per replica | engine queued / running | NATS msgs/s in+out | MiB per process |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |"]  # fmt: skip
    for s in stages:
        eng = "; ".join(f"{k} {e['queued_mean']} / {e['running_mean']}" for k, e in s["engines"].items())
        ev = "; ".join(f"{k} {v:g}" for k, v in s["events_per_s"].items())
        nm = s["nats_per_s"].get("in_msgs", 0) + s["nats_per_s"].get("out_msgs", 0)
        mib = ", ".join(
            f"{k} {v:.0f}" for k, v in s.get("memory_mib", {}).items() if not k.startswith("load-")
        )
        lines.append(f"| {s['agents']} | {s.get('open_episodes', '-')} | {s['episodes_per_s']} | {s['calls_per_s']} | "
                     f"{s['call_p50_s']} | {s['call_p99_s']} | {s['begin_p50_s']} | {s['begin_p99_s']} | {s['errors']} | "
                     f"{ev} | {eng} | {nm:g} | {mib} |")  # fmt: skip
    if stages:
        cols = sorted(stages[0]["cpu_cores"])
        lines += ["", "CPU in cores per process (`@machine_busy`: the whole machine; `@others`: what processes "
                  "outside this benchmark took; `bench`: this script):", "",
                  "| agents | " + " | ".join(cols) + " |", "| ---: |" + " ---: |" * len(cols)]  # fmt: skip
        lines += [f"| {s['agents']} | " + " | ".join(f"{s['cpu_cores'].get(k, 0):.2f}" for k in cols) + " |"
                  for s in stages]  # fmt: skip
    lines += ["", "Signals (a queue that grows, or a process at its CPU limit) and caveats, per stage:", ""]
    for s in stages:
        said = [*s["signals"], *([f"caveat: {s['caveat']}"] if s["caveat"] else [])]
        lines.append(f"- {s['agents']} agents: {'; '.join(said) or 'none'} (open sockets per process at the "
                     f"end: {s['sockets']})")  # fmt: skip
    fb = run["first_bottleneck"]
    first = f"at {fb['agents']} agents: " + "; ".join(fb["signals"]) if fb else "no signal at any stage"
    led, fin = run["ledger"], run["agents_final"]
    return lines + ["", f"**First bottleneck** (the earliest stage with a signal): {first}.", "",
                    f"Accounting: agents ended {fin.get('ended', 0)} episodes (aborted {fin.get('aborted', 0)}, "
                    f"errors {fin.get('errors', 0)}) with {fin.get('calls', 0)} successful calls; the ledger holds "
                    f"episodes {led['episodes_by_status']} and {led['llm_calls']} LLM calls; pipeline drained: "
                    f"{run['pipeline_settled']}."]  # fmt: skip


def write_md(r: dict[str, Any], path: Path) -> None:
    m, c, p = r["machine"], r["config"], r["paper"]
    lines = [
        "# Load test: many agents on the swarm's data path",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB, torch {m['torch']}, {m['nats_server']}, {m['date']} "
        f"(load average {m['load_average']} at the end). Command: `{r['command']}`.",
        "",
        f"Agents: {c['procs']} load processes, each {c['clients_per_proc']} `SwarmClient` connection(s), each "
        f"with its own NATS identity; an episode = begin (token from the gateway), {c['calls']} chat completions "
        f"(max_tokens {c['max_tokens']}, the embedded CPU engine on the tiny model), reward, end; "
        + (
            f"before each call a think time, lognormal with median {c['think_median_s']:g} s (sigma "
            f"{c['think_sigma']:g}), new agents beginning over {c['ramp_s']:g} s. "
            if c["think_median_s"] > 0
            else "no think time. "
        )
        + "No trainer. Stages of "
        f"{c['stage_s']:g} s, figures over their last {'half' if c['think_median_s'] > 0 else 'two thirds'}. Latency: a call as the agent sees it, through "
        "the gateway (engine included); begin: token request and `begin` published. Events/s: deltas of each "
        "replica's JetStream consumers' delivered counts (the ledger's over every stream it reads). CPU from "
        "/proc, in cores (1.0 = one core busy).",
    ]
    lines += ["", "## Side by side (each run's stage with the most calls/s, errors under 1%)", "",
              "| replicas | agents | episodes/s | calls/s | call p50 / p99 s | events/s per merger | events/s per "
              "ledger | ramp stopped | first bottleneck |", "| ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- |"]  # fmt: skip
    for run in r["runs"]:
        if (s := best(run)) is not None:
            per = {svc: ", ".join(f"{v:g}" for k, v in s["events_per_s"].items() if k.startswith(f"{svc}/"))
                   for svc in ("merger", "ledger")}  # fmt: skip
            fb = run["first_bottleneck"]
            first = f"at {fb['agents']} agents: {'; '.join(fb['signals'])}" if fb else "none"
            lines.append(f"| {run['replicas']} | {s['agents']} | {s['episodes_per_s']} | {s['calls_per_s']} | "
                         f"{s['call_p50_s']} / {s['call_p99_s']} | {per['merger']} | {per['ledger']} | "
                         f"{run['stop_reason']} | {first} |")  # fmt: skip
    for run in r["runs"]:
        lines += run_md(run)
    if c["think_median_s"] > 0:
        from load_crowd import crowd_md

        path.write_text("\n".join(lines + crowd_md(r)) + "\n")
        return
    lines += ["", f"## {c['paper_agents']:,} agents, on paper", "",
              f"From the best stage of {p.get('from', '-')}; an agent assumed to call every "
              f"{c['paper_call_interval_s']:g} s. A service's capacity per process = its measured rate / its measured "
              "CPU (a service process works on one core), planned at 70% of a core. The engine's figure is the tiny "
              "model on the CPU: a real model's engines are sized by their own benchmark (`bench/engines.py`).",
              "", *[f"- {ln}" for ln in p.get("lines", [p.get("why", "")])]]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def report(runs: list[dict[str, Any]], args: argparse.Namespace, command: str) -> dict[str, Any]:
    """load.json's content: the command, the machine, every flag, the runs and the paper sizing."""
    from benchutil import machine
    from load_crowd import memory_figures, paper_crowd

    if args.think_median_s > 0:
        for run in runs:
            run["memory"] = memory_figures(run)
    return {
        "benchmark": "load", "command": command,
        "machine": machine(), "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "runs": runs, "paper": paper_crowd(runs, args) if args.think_median_s > 0 else paper(runs, args),
    }  # fmt: skip


def write_report(result: dict[str, Any], out: Path, name: str) -> Path:
    """Writes `<out>/<name>.json` and `<out>/<name>.md`; returns the JSON file's path."""
    from benchutil import write_json

    path = write_json(name, result, out)
    write_md(result, out / f"{name}.md")
    return path
