"""Network faults between hosts while a swarm trains across them: `bench/results/partitions.{json,md}`.

    python bench/partitions.py [--cut-hosts c,a,b] [--pair b,c] [--quick] [--out bench/results]

1. Three hosts as network namespaces of this machine (`tests/support/netns.py`), the pair `--pair` shaped (its
   TCP connections through the delaying relay from the start, delay 0), and the multi-host recipe
   (`infra/multihost.md`) run on them as written (`tests/support/multihost.py`): NATS node, trainer on A;
   node, engine, gateway on B; node, merger, ledger, agents on C.
2. From `--warmup-s` after the first train step, one fault at a time, each followed by `--gap-s` to
   recover: every host of `--cut-hosts` cut off from the others for `--cut-s` (nftables drops every
   packet between it and them, both ways) and healed; `--latency-ms` +- `--jitter-ms` (each way, the
   relay) and `--loss-pct` packet loss (nftables `numgen random mod 100 < N drop`, each way) between the
   pair for `--degrade-s`; the trainer's host A isolated from the engines' host B for `--isolate-s`
   (C still reaches both). The kernel here has no `netem` qdisc (`tc qdisc add dev lo root netem
   delay 1ms`: "Specified qdisc kind is unknown"), hence nftables and the relay.
3. The swarm is stopped (the recipe's order; the NATS nodes last, after the streams are read) and
   accounted exactly as `bench/chaos.py` accounts (`chaos_accounting.py`): lost and doubled samples,
   train steps and ledger rows, dead letters, samples trained at most once; plus, per fault, what each
   host's processes did during it (records they made, the warnings they logged, which NATS nodes were
   healthy) and the time from the heal to the next train step, ledger part, llm call and merge.

`ok` is every check at once; the exit code is 1 unless `ok`. Needs root, `ip netns` and `nft`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json
from chaos_accounting import account_ledger, account_streams, read_streams
from partitions_report import activity, log_digest, recovery, write_md

from tests.support.multihost import RECIPE, Recipe, operator_url, secrets_env
from tests.support.netns import Hosts, unavailable

QUICK = {
    "cut_s": 10.0,
    "degrade_s": 20.0,
    "isolate_s": 10.0,
    "gap_s": 40.0,
    "warmup_s": 15.0,
    "cut_hosts": "c",
}
NODES = {"a": "A", "b": "B", "c": "C"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/partitions.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = p.add_argument
    add("--cut-hosts", default="c,a,b", help="hosts cut off one after the other (each from both others)")
    add("--cut-s", type=float, default=30.0, help="seconds each cut lasts")
    add("--pair", default="b,c", help="the two hosts between which latency and loss are added")
    add("--latency-ms", type=float, default=100.0, help="mean delay each way")
    add("--jitter-ms", type=float, default=50.0, help="the delay's spread each way (uniform, +-)")
    add("--loss-pct", type=int, default=5, help="packets dropped each way, percent")
    add("--degrade-s", type=float, default=120.0, help="seconds of latency and loss")
    add("--isolate-s", type=float, default=30.0, help="seconds the trainer's host A is cut from B")
    add("--gap-s", type=float, default=75.0, help="seconds after each fault before the next (or the stop)")
    add(
        "--warmup-s",
        type=float,
        default=60.0,
        help="seconds after the first train step before the first fault",
    )
    add(
        "--work-dir",
        type=Path,
        default=None,
        help="hosts' directories and logs (default runs/partitions-<time>)",
    )
    add("--out", type=Path, default=RESULTS, help="where <name>.json and <name>.md go")
    add("--name", default="partitions", help="results file name")
    add("--quick", action="store_true", help=f"a small run: {QUICK}")
    if p.parse_args(argv).quick:
        p.set_defaults(**QUICK)
    return p.parse_args(argv)


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The faults, in order: kind, target and how long."""
    a, b = args.pair.split(",")
    faults = [{"kind": "cut", "target": h, "s": args.cut_s} for h in args.cut_hosts.split(",") if h]
    faults.append({"kind": "degrade", "target": f"{a}-{b}", "s": args.degrade_s,
                   "latency_ms": args.latency_ms, "jitter_ms": args.jitter_ms, "loss_pct": args.loss_pct})  # fmt: skip
    faults.append({"kind": "isolate", "target": "a-b", "s": args.isolate_s})
    return faults


def inject(hosts: Hosts, fault: dict[str, Any]) -> None:
    if fault["kind"] == "cut":
        hosts.cut(fault["target"])
    elif fault["kind"] == "degrade":
        x, y = fault["target"].split("-")
        hosts.delay(x, y, fault["latency_ms"], fault["jitter_ms"])
        hosts.loss(x, y, fault["loss_pct"])
    else:
        x, y = fault["target"].split("-")
        hosts.cut(x, [y])


def clear(hosts: Hosts, fault: dict[str, Any]) -> None:
    if fault["kind"] == "degrade":
        x, y = fault["target"].split("-")
        hosts.delay(x, y, 0)
        hosts.loss(x, y, 0)
    else:
        hosts.heal()


PROBE = """
import socket, sys, time
out = []
for _ in range(7):
    t = time.monotonic()
    with socket.create_connection((sys.argv[1], 4222), timeout=10) as c:
        c.recv(1)  # the server's INFO line, sent on connect: one trip from the node back to here
    out.append((time.monotonic() - t) * 1000)
print(sorted(out)[len(out) // 2])
"""


def link_ms(hosts: Hosts, src: str, dst: str) -> float | None:
    """Median ms from connecting `src` to `dst`'s NATS port to the first byte back (the link's latency)."""
    cmd = hosts.argv(src, [sys.executable, "-c", PROBE, hosts.hosts[dst].addr], hide=False)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return round(float(done.stdout), 1) if done.returncode == 0 and done.stdout.strip() else None


class NodeWatch:
    """Each NATS node's health (`/healthz`) and the meta leader it sees (`/jsz`), every 2 s, from here."""

    def __init__(self, hosts: Hosts) -> None:
        self.addrs = {NODES[n]: h.addr for n, h in hosts.hosts.items()}
        self.samples: list[dict[str, Any]] = []

    async def run(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=1.5) as http:
            while True:
                row: dict[str, Any] = {"t": time.time()}
                for node, addr in self.addrs.items():
                    try:
                        health = (await http.get(f"http://{addr}:8222/healthz")).json().get("status") == "ok"
                        leader = (
                            (await http.get(f"http://{addr}:8222/jsz"))
                            .json()
                            .get("meta_cluster", {})
                            .get("leader")
                        )
                    except (httpx.HTTPError, ValueError):
                        health, leader = False, None
                    row[node] = {"healthy": health, "leader": leader or ""}
                self.samples.append(row)
                await asyncio.sleep(2.0)


async def first_step(url: str, timeout_s: float, recipe: Recipe) -> float:
    """Wait for the trainer's first step (KV version 1); returns when."""
    from swarmrl.schemas import ModelVersion, decode
    from swarmrl.services.common import bus

    nc = await bus.connect(url, "bench-partitions")
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if dead := recipe.dead():
                raise RuntimeError(f"recipe processes exited before the first step: {dead}")
            with contextlib.suppress(Exception):
                entry = await (await bus.models_kv(nc.jetstream())).get("policy")
                if entry.value and decode(entry.value, ModelVersion).version >= 1:
                    return time.time()
            await asyncio.sleep(2.0)
    finally:
        await nc.close()
    raise TimeoutError(f"no train step within {timeout_s:.0f} s")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from swarmrl.bootstrap import ensure_model

    work = (args.work_dir or Path("runs") / f"partitions-{dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    model = ensure_model("tiny", progress=False)
    pair = tuple(args.pair.split(","))
    faults = plan(args)
    t0 = time.time()
    with Hosts(list(NODES), work / "hosts", shaped=[pair]) as hosts:  # type: ignore[list-item]
        for h in ("a", "b"):  # the base model "installed" where a trainer and an engine run
            shutil.copytree(model, hosts.hosts[h].dir / "home" / "models" / model.name)
        with Recipe(RECIPE, hosts, env={"OMP_NUM_THREADS": "1"}) as recipe:
            recipe.start()
            url = operator_url(hosts, secrets_env(hosts.hosts["a"].dir / "secrets.env"))
            watch = NodeWatch(hosts)
            watcher = asyncio.create_task(watch.run())
            stepped = await first_step(url, 900, recipe)
            print(
                f"partitions: first train step {stepped - t0:.0f} s after the start; faults in {args.warmup_s:g} s",
                flush=True,
            )
            await asyncio.sleep(args.warmup_s)
            for f in faults:
                x, _, y = f["target"].partition("-")
                if f["kind"] == "degrade":
                    f["link_ms_before"] = await asyncio.to_thread(link_ms, hosts, y, x)
                f["start"] = time.time()
                inject(hosts, f)
                print(f"partitions: {f['kind']} {f['target']} for {f['s']:g} s", flush=True)
                if f["kind"] == "degrade":
                    f["link_ms_during"] = await asyncio.to_thread(link_ms, hosts, y, x)
                await asyncio.sleep(max(0.0, f["start"] + f["s"] - time.time()))
                clear(hosts, f)
                f["heal"] = time.time()
                await asyncio.sleep(args.gap_s)
            dead = recipe.dead()
            codes = recipe.stop(keep=("A:nats", "B:nats", "C:nats"))
            stopped = time.time()
            print(f"partitions: services stopped ({codes}); accounting", flush=True)
            streams, consumers = await read_streams(url)
            watcher.cancel()
            codes |= recipe.stop()
        logs = log_digest(hosts.root, faults)
    acct = account_streams(streams, consumers, [])
    acct["ledger"] = account_ledger(work / "hosts" / "c" / "run", streams)
    parts = sorted(p.stat().st_mtime for p in (work / "hosts" / "c" / "run" / "ledger").rglob("part-*.parquet")
                   if p.stem != "part-empty")  # fmt: skip
    for f in faults:
        f["recovery"] = recovery(f, streams, parts, watch.samples)
        f["during"] = activity(f["start"], f["heal"], streams, parts, watch.samples)
        f["before"] = activity(f["start"] - f["s"], f["start"], streams, parts, watch.samples)
        f["logs"] = logs[faults.index(f)]
    return summarize(args, work, faults, acct, streams, dead, codes, t0, stepped, stopped)


def summarize(
    args: argparse.Namespace, work: Path, faults: list[dict[str, Any]], acct: dict[str, Any], streams: Any,
    dead: dict[str, int], codes: dict[str, int], t0: float, stepped: float, stopped: float,
) -> dict[str, Any]:  # fmt: skip
    ep = acct["episodes"]
    ledger_missing = sum(s["missing"] for s in acct["ledger"].values())
    ledger_extra = sum(s["duplicate_rows"] + s["rows_not_in_stream"] for s in acct["ledger"].values())
    doubled = sum(acct["doubled"].values()) + ledger_extra
    never = [
        e for e, x in streams.episodes.items() if not x.eval and x.begin_ts is not None and not x.outcome
    ]
    unexplained = [
        e
        for e in never
        if not any(f["start"] - 120 <= streams.episodes[e].begin_ts <= f["heal"] for f in faults)
    ]
    tr = acct["training"]
    checks = {
        "no process exited before the stop": not dead,
        "every process exited 0 at the stop": bool(codes) and all(c == 0 for c in codes.values()),
        "lost = 0": not acct["lost"],
        "every dropped episode's models told (lost-episode records)": acct["lost_records_missing_count"] == 0,
        "doubled = 0": doubled == 0,
        "aborted / never-ended episodes without samples": not (acct["aborted_with_samples"] or acct["never_ended_with_samples"]),
        "generated tokens = trainable tokens of the samples": not acct["token_mismatch"],
        "ledger rows = stream messages": ledger_missing == 0 and ledger_extra == 0,
        "no dead letters": not acct["dead_letters"],
        "every never-ended episode begun during (or up to 120 s before) a fault": not unexplained,
        "trained at most once": tr.get("trained_twice", 0) == 0 if tr["measured"] else None,
        "every untrained sample accounted for": tr.get("unaccounted", 0) == 0 if tr["measured"] else None,
        "after every heal: a train step, a ledger part, an llm call and a merge": all(
            all(v is not None for k, v in f["recovery"].items() if k.startswith("next_")) for f in faults
        ),
        "after every heal: every NATS node healthy again": all(f["recovery"]["nodes_healthy_s"] is not None for f in faults),
    }  # fmt: skip
    return {
        "benchmark": "partitions",
        "command": shlex.join(["bench/partitions.py", *sys.argv[1:]]),
        "machine": machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "recipe": str(RECIPE.relative_to(RECIPE.parents[1])),
        "work_dir": str(work),
        "wall_s": round(stopped - t0, 1),
        "first_step_after_s": round(stepped - t0, 1),
        "lost": len(acct["lost"]),
        "doubled": doubled,
        "ledger_missing_rows": ledger_missing,
        "never_ended": len(never),
        "never_ended_unexplained": unexplained[:20],
        "exit_codes": codes,
        "exited_early": dead,
        "faults": faults,
        "checks": checks,
        "ok": all(v is True for v in checks.values()),
        "accounting": acct | {"episodes": ep},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if reason := unavailable(need_nft=True):
        print(f"partitions: cannot run here: {reason}", file=sys.stderr)
        return 2
    result = asyncio.run(run(args))
    path = write_json(args.name, result, args.out)
    write_md(result, args.out / f"{args.name}.md")
    failed = [k for k, v in result["checks"].items() if v is not True]
    print(f"partitions: wrote {path} and {args.name}.md; lost {result['lost']}, doubled {result['doubled']}; "
          f"failed or unmeasured checks: {failed or 'none'}", flush=True)  # fmt: skip
    print(json.dumps({f"{f['kind']} {f['target']}": f["recovery"] for f in result["faults"]}, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
