"""`bench/load.py` with thinking agents: memory per open episode and per connection, and a crowd on paper.

`memory_figures` fits, per service (its replicas summed), resident memory against the open episodes
of the connected baseline (agents 0) and of every stage without errors over 1%: the slope is KiB per
open episode. nats-server's cost per client connection is its growth from before the load processes
connected to after (all of them, no agent yet), divided by the connections they opened; a load
process's, the same per `SwarmClient`. `paper_crowd` sizes `--paper-agents` thinking agents from the
one-replica run's per-agent figures (calls, events and NATS messages a second per agent, CPU per
call or event, memory per episode and per connection), the arithmetic shown.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

SERVICES = ("gateway", "merger", "ledger", "engine", "nats", "load")


def _service(name: str) -> str:
    return name.split("-")[0]


def _by_service(memory: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, mib in memory.items():
        if not name.startswith("@") and _service(name) in SERVICES:
            out[_service(name)] = out.get(_service(name), 0.0) + mib
    return out


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs (None with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def memory_figures(run: dict[str, Any]) -> dict[str, Any]:
    """KiB per open episode per service, KiB per NATS connection (server and client side), and the
    MiB each service held at the largest stage."""
    base = _by_service(run["connected_memory_mib"])
    ok = [s for s in run["stages"] if s["error_rate"] <= 0.01]
    points = [(0.0, base)] + [(s["open_episodes_end"], _by_service(s["memory_mib"])) for s in ok]
    per_episode = {}
    for svc in SERVICES:
        xs = [x for x, m in points if svc in m]
        slope = _slope(xs, [m[svc] for _, m in points if svc in m])
        per_episode[svc] = None if slope is None else round(slope * 1024, 2)
    idle, connected = run["idle_memory_mib"], run["connected_memory_mib"]
    opened = connected.get("@nats_connections", 0) - idle.get("@nats_connections", 0)
    load_mib = sum(v for k, v in connected.items() if _service(k) == "load")
    return {
        "kib_per_open_episode": per_episode,
        "nats_kib_per_connection": round((connected.get("nats", 0) - idle.get("nats", 0)) * 1024 / opened, 1)
        if opened > 0
        else None,
        "nats_connections_opened": opened,
        "load_process_mib_per_connection": round(load_mib / max(run["connections"], 1), 2),
        "mib_at_largest_stage": _by_service(ok[-1]["memory_mib"]) if ok else {},
        "open_episodes_at_largest_stage": ok[-1]["open_episodes_end"] if ok else 0,
    }


def paper_crowd(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Processes, NATS nodes and memory for `args.paper_agents` thinking agents, from the per-agent
    figures of the one-replica run's largest stage without errors over 1%."""
    run = next((r for r in runs if r["replicas"] == 1), runs[0])
    ok = [s for s in run["stages"] if s["error_rate"] <= 0.01 and s["open_episodes"] > 0]
    if not ok:
        return {"why": "no stage without errors"}
    s, mem = ok[-1], run["memory"]
    n, agents = s["agents"], args.paper_agents
    k = agents / n
    per_agent_calls = s["calls_per_s"] / n
    lines = [f"Measured at {n} agents ({s['open_episodes']:g} episodes open on average) on one of each service: "
             f"{s['calls_per_s']:g} calls/s ({per_agent_calls:.4f} per agent), think median {s['think_median_s']:g} s. "
             f"{agents:,} agents = x{k:.1f} every rate: {per_agent_calls * agents:,.0f} calls/s."]  # fmt: skip
    out: dict[str, Any] = {"from": f"replicas=1, {s['agents']} agents", "scale": round(k, 2)}

    def size(svc: str, rate: float, unit: str, aim: float = 0.7, per_episode: bool = True) -> None:
        cpu = sum(v for name, v in s["cpu_cores"].items() if _service(name) == svc)
        if cpu <= 0 or rate <= 0:
            return
        per_core = rate / cpu
        need = math.ceil(rate * k / (aim * per_core))
        kib = mem["kib_per_open_episode"].get(svc) if per_episode else None
        held = None if kib is None else max(kib, 0.0) * agents / 1024
        out[svc] = {"per_core": round(per_core, 1), "load": round(rate * k, 1), "processes": need,
                    "episode_mib_total": None if held is None else round(held, 1)}  # fmt: skip
        memo = "" if held is None else (f"; memory: {kib:g} KiB per open episode x {agents:,} = {held:,.0f} MiB "
                                        f"in all, {held / need:,.0f} MiB a process")  # fmt: skip
        lines.append(f"{svc}: {rate:g} {unit}/s on {cpu:.2f} cores -> {per_core:.1f} per core; {rate * k:,.0f} "
                     f"{unit}/s at {aim:.0%} of a core each -> **{need} processes**{memo}.")  # fmt: skip

    merger_ev = sum(v for name, v in s["events_per_s"].items() if name.startswith("merger/"))
    ledger_ev = sum(v for name, v in s["events_per_s"].items() if name.startswith("ledger/"))
    size("gateway", s["calls_per_s"], "calls")
    size("engine", s["calls_per_s"], "calls", per_episode=False)  # weights and KV cache: not per episode
    size("merger", merger_ev, "events")
    size("ledger", ledger_ev, "events")
    msgs = s["nats_per_s"].get("in_msgs", 0) + s["nats_per_s"].get("out_msgs", 0)
    ncpu = s["cpu_cores"].get("nats", 0.0)
    per_conn = s["agents"] / max(run["connections"], 1)
    conns = math.ceil(agents / per_conn)
    conn_kib = mem["nats_kib_per_connection"]
    if msgs and ncpu:
        per_core = msgs / ncpu
        nodes = max(3, math.ceil(msgs * k / (0.5 * per_core * args.paper_node_cores)))
        kib = mem["kib_per_open_episode"].get("nats") or 0.0
        node_mib = (max(kib, 0.0) * agents + (conn_kib or 0.0) * conns) / 1024 / nodes
        out["nats"] = {
            "msgs_per_s": round(msgs * k),
            "nodes": nodes,
            "connections": conns,
            "node_mib": round(node_mib),
        }
        lines.append(f"NATS: {msgs:g} msgs/s in+out on {ncpu:.2f} cores -> {per_core:,.0f} per core; {msgs * k:,.0f} "
                     f"msgs/s at half of {args.paper_node_cores}-core nodes -> **{nodes} nodes** (3 at least); "
                     f"{conns:,} client connections ({per_conn:g} agents each) x {conn_kib} KiB + {kib:g} KiB per open "
                     f"episode -> {node_mib:,.0f} MiB a node, the connections spread over the nodes.")  # fmt: skip
    lines.append(f"Agents' side: a load process holds {mem['load_process_mib_per_connection'] * run['connections'] / max(run['procs'], 1):.0f} "
                 f"MiB with its {run['connections'] // max(run['procs'], 1)} `SwarmClient` connections before any agent "
                 f"(the interpreter and the SDK), then {mem['kib_per_open_episode'].get('load')} KiB per agent with an "
                 "open episode.")  # fmt: skip
    out["lines"] = lines
    return out


def crowd_md(r: dict[str, Any]) -> list[str]:
    """The memory table of every run and the paper sizing, as md lines."""
    lines = ["", "## Memory per open episode and per connection", "",
             "KiB of resident memory per open episode (least-squares slope over the connected baseline and every "
             "stage without errors, each service's replicas summed; the engine's is its weights and KV cache warming "
             "up, not a cost of episodes); nats-server per client connection: its growth when the load processes "
             "connected (before any agent), per connection opened.", "",
             "| replicas | " + " | ".join(SERVICES) + " | nats KiB / connection | MiB held at the largest stage |",
             "| ---: |" + " ---: |" * len(SERVICES) + " ---: | --- |"]  # fmt: skip
    for run in r["runs"]:
        m = run["memory"]
        per = " | ".join(str(m["kib_per_open_episode"].get(svc)) for svc in SERVICES)
        held = ", ".join(f"{k} {v:.0f}" for k, v in m["mib_at_largest_stage"].items())
        lines.append(f"| {run['replicas']} | {per} | {m['nats_kib_per_connection']} | {held} "
                     f"({m['open_episodes_at_largest_stage']:g} open) |")  # fmt: skip
    p, c = r["paper"], r["config"]
    lines += ["", f"## {c['paper_agents']:,} thinking agents, on paper", "",
              "A service's capacity per process = its measured rate / its measured CPU (one core each), planned at 70% "
              "of a core; memory from the per-episode slopes above. The engine is the tiny model on the CPU: a real "
              "model's engines are sized by their own benchmark (`bench/engines.py`).", "",
              *[f"- {ln}" for ln in p.get("lines", [p.get("why", "")])]]  # fmt: skip
    return lines
