"""Chaos benchmark: the default swarm trains on a 3-node JetStream cluster while its processes are killed.

    python bench/chaos.py [--minutes 15] [--seed 0] [--service-kills 2] [--node-kills 1] [...] [-- UP ARGS]
    just chaos --minutes 15
    just chaos --replicas 2      # two of each service: a kill is covered by the other replica

1. Starts a local 3-node cluster (`tests/support/nats_cluster.py`; streams with 3 replicas) and `swarmrl up`
   on it (`--nats-conf` = the cluster's shared conf dir; the service URL of all three nodes in
   `$SWARMRL_NATS`), with the default swarm (calculator, the `tiny` preset) but 3 clients playing 8
   groups each at once (see below). Arguments after `--` go to `up` as they are.
2. Injects faults (`chaos_faults.py`): clients SIGKILLed at random until at least `--touch-target`
   of the training episodes were open at their client's kill (their episodes never end; the merger
   times them out after `--episode-timeout-s`); each of merger, trainer, ledger, gateway and engine
   SIGKILLed `--service-kills` times and one cluster node `--node-kills` times (down `--node-down-s`,
   then restarted on its store), at random times at least `--min-gap-s` apart. `up`'s supervisor
   restarts every killed process.
3. When `up` has stopped, accounts exactly from the streams and the ledger (`chaos_accounting.py`):
   lost and doubled samples, train steps and ledger rows, dead letters, time to recover per fault
   kind, distinct task instances per training episode, and the held-out eval curve. Writes
   `<out>/<name>.json` and `<out>/<name>.md`; `ok` is every check at once (one not measured fails
   it too), and the exit code is 1 unless `ok`.
4. Learning is checked against a fault-free run of the same swarm on the same cluster for the same
   time (`--no-faults`; `<out>/<name>-fault-free.json`, run first when none of this swarm is there):
   the final held-out success within 10 points of the run's best and at least 0.9x the fault-free
   run's final, and distinct instances per training episode at least 0.9x the fault-free run's (a
   restarted client continues its task stream; one that started it over would train on its first
   questions again and again).

Why `--clients 3 --concurrency 8` (default 2 and 2): a client is killed at most 3 times in any 120 s
(`up` gives up on a child that exits 5 times in 120 s), so the share of episodes the kills touch is
about (kills per second) x (episodes open per client at a kill) / (episodes begun per second). On 2
cores the default swarm keeps ~13 episodes open per client for ~4 s each, which bounds it near 15%;
8 groups per client keep up to 64 open (the gateway's admission control still paces new groups to
the trainer), a third client adds kill budget, and kills are aimed at busy moments (`--busy-frac`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json
from chaos_accounting import account, checks_table
from chaos_faults import SERVICES, FaultConfig, Injector, plan, read_journal

from swarmrl.report import restart_counts
from tests.support.nats_cluster import NatsCluster

KINDS = ("client", *SERVICES, "nats-node")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/chaos.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--minutes", type=float, default=15.0, help="wall-clock budget of the swarm (up --minutes)")
    add("--seed", type=int, default=0, help="seeds the fault schedule and the victims")
    add("--clients", type=int, default=3, help="client processes (up --clients)")
    add("--concurrency", type=int, default=8, help="GRPO groups each client plays at once (up --concurrency)")
    add("--client-every-s", type=float, default=2.0, help="mean seconds between client-kill attempts")
    add("--touch-target", type=float, default=0.4,
        help="kill clients while fewer than this share of training episodes were open at their client's kill")  # fmt: skip
    add("--busy-frac", type=float, default=0.75,
        help="kill a client only while it has at least this share of the most episodes it had open in the last minute")  # fmt: skip
    add(
        "--kills-per-window",
        type=int,
        default=3,
        help="most kills of one client in any 120 s (up gives up at 5 exits)",
    )
    add(
        "--min-alive-s",
        type=float,
        default=15.0,
        help="kill a (restarted) client only after it has run this long",
    )
    add(
        "--service-kills",
        type=int,
        default=2,
        help="SIGKILLs of each of merger, trainer, ledger, gateway, engine",
    )
    add("--node-kills", type=int, default=1, help="cluster node faults (SIGKILL, then restart)")
    add("--node-down-s", type=float, default=20.0, help="seconds a killed node stays down")
    add("--min-gap-s", type=float, default=40.0,
        help="least seconds between two service/node faults (after a node fault: after its restart)")  # fmt: skip
    add("--episode-timeout-s", type=float, default=45.0,
        help="merger's timeout of a silent episode (a killed client's; default 300 s in up)")  # fmt: skip
    add("--warmup-s", type=float, default=10.0, help="no fault before this long after the first trainer step")
    add(
        "--work-dir",
        type=Path,
        default=None,
        help="cluster stores, up's run dir and logs (default runs/chaos-<time>)",
    )
    add("--out", type=Path, default=RESULTS, help="where <name>.json and <name>.md go")
    add("--no-faults", action="store_true",
        help="inject nothing: the fault-free run of the same swarm that the learning checks compare with")  # fmt: skip
    add("--baseline", default="auto",
        help="the fault-free run's JSON (written with --no-faults); 'auto': <out>/<name>-fault-free.json "
        "when it ran this swarm (same --minutes, --clients, --concurrency, --episode-timeout-s and up args), "
        "else it is run first and written there")  # fmt: skip
    add("--replicas", type=int, default=1,
        help="processes of each of merger, ledger, gateway, engine and trainer (`[replicas]`); a kill then "
        "takes one replica, and the others cover it (partitions by lease; token requests in a queue group; "
        "the gateway's engine pool; a standby trainer takes the lead), each kind's median recovery within "
        "10 s. Learning is compared with a fault-free run of the same replicated swarm")  # fmt: skip
    add("--name", default=None, help="results file name (default chaos, or chaos-replicas with --replicas)")
    add("up_args", nargs="*", help="after --: more `swarmrl up` flags (e.g. --model DIR --task guess_number)")
    args = p.parse_args(argv)
    args.name = args.name or ("chaos" if args.replicas == 1 else "chaos-replicas")
    return args


def replicas_config(args: argparse.Namespace, work: Path) -> list[str]:
    """`up` flags for `--replicas`: a description holding only `[replicas]` (flags set the rest)."""
    if args.replicas == 1:
        return []
    path = work / "replicas.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '[models.policy]\nbase = "tiny"\n\n[tasks.calculator]\n\n[replicas]\n'
        + "".join(
            f"{svc} = {args.replicas}\n" for svc in ("merger", "ledger", "gateway", "engine", "trainer")
        )
    )
    return ["--config", str(path)]


async def run(args: argparse.Namespace, baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    work = args.work_dir or Path("runs") / f"chaos-{dt.datetime.now():%Y%m%d-%H%M%S}"
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    cluster = NatsCluster(work / "nats").start()
    cfg = FaultConfig(
        client_every_s=args.client_every_s, touch_target=args.touch_target, busy_frac=args.busy_frac,
        kills_per_window=args.kills_per_window, min_alive_s=args.min_alive_s, service_kills=args.service_kills,
        node_kills=args.node_kills, node_down_s=args.node_down_s, min_gap_s=args.min_gap_s, seed=args.seed,
    )  # fmt: skip
    up_cmd = [
        sys.executable, "-m", "swarmrl.cli", "up", "--nats-conf", str(cluster.conf_dir), "--run-dir", str(run_dir),
        "--no-display", "--minutes", f"{args.minutes:g}", "--steps", "100000", "--clients", str(args.clients),
        "--concurrency", str(args.concurrency), *replicas_config(args, work), *args.up_args,
    ]  # fmt: skip
    env = os.environ | {
        "SWARMRL_NATS": cluster.service_url,  # never on a command line
        "SWARMRL_STREAM_REPLICAS": "3",
        "SWARMRL_EPISODE_TIMEOUT_S": f"{args.episode_timeout_s:g}",
    }
    env |= cluster.password_env  # the role passwords: up starts each service as its own NATS user
    injector = Injector(cfg, run_dir, cluster)
    up = None
    try:
        log = await asyncio.to_thread(open, work / "up.log", "ab")
        with log:  # the child keeps its own copy of the descriptor
            up = await asyncio.create_subprocess_exec(*up_cmd, stdout=log, stderr=log, env=env)
        injector.t0 = t0 = time.time()
        print(f"chaos: up pid {up.pid}, run dir {run_dir}, log {work / 'up.log'}", flush=True)
        await injector.watch()
        faults = asyncio.create_task(asyncio.sleep(0) if args.no_faults else _inject(injector, args, t0))
        rc = await up.wait()
        faults.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await faults
        await injector.close()
        ended = time.time()
        print(f"chaos: up exited with {rc} after {ended - t0:.0f} s; accounting", flush=True)
        (work / "faults.json").write_text(json.dumps(injector.faults, indent=1))
        restarts = read_journal(run_dir)
        acct = await account(cluster.service_url, run_dir, injector.faults, restarts)
    finally:
        if up is not None and up.returncode is None:  # we failed: stop the swarm as Ctrl-C would
            up.send_signal(signal.SIGINT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(up.wait(), 120)
            if up.returncode is None:
                up.kill()
        cluster.stop()
    return summarize(args, up_cmd, rc, ended - t0, run_dir, injector, acct, baseline)


async def _inject(injector: Injector, args: argparse.Namespace, t0: float) -> None:
    """Faults from `--warmup-s` after the first trainer step until the episodes a killed client left
    open have time to time out and every fault has time to show its recovery before the budget ends."""
    end = t0 + args.minutes * 60 - args.episode_timeout_s - 45
    with contextlib.suppress(TimeoutError):  # a trainer that never steps is no reason to spare the rest
        await asyncio.wait_for(injector.first_step.wait(), timeout=args.minutes * 60 / 3)
    start = time.time() + args.warmup_s
    await asyncio.sleep(args.warmup_s)
    try:
        schedule = plan(injector.cfg, injector.rng, end - start)
    except ValueError as exc:  # no room for it: the run goes on; the results show what is missing
        print(f"chaos: {exc}", flush=True)
        schedule = []
    await asyncio.gather(injector.clients(until=end), injector.scheduled(start, schedule))


def summarize(
    args: argparse.Namespace,
    up_cmd: list[str],
    rc: int,
    wall_s: float,
    run_dir: Path,
    injector: Injector,
    acct: dict[str, Any],
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    faults = acct.pop("recovery")
    recovery: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        times = [  # a node, held down on purpose, counts from its restart
            f["caught_up_s"] if kind == "nats-node" else f["recovered_after_s"]
            for f in faults
            if f["kind"] == kind and f.get("recovered_after_s") is not None
        ]
        restarted = [
            f["restarted_after_s"]
            for f in faults
            if f["kind"] == kind and f.get("restarted_after_s") is not None
        ]
        recovery[kind] = {
            "faults": sum(f["kind"] == kind for f in faults),
            "recovered": len(times),
            "recover_median_s": round(statistics.median(times), 1) if times else None,
            "recover_max_s": round(max(times), 1) if times else None,
            "restart_median_s": round(statistics.median(restarted), 1) if restarted else None,
        }
    doubled = sum(acct["doubled"].values())
    ledger_missing = sum(s["missing"] for s in acct["ledger"].values())
    ledger_extra = sum(s["duplicate_rows"] + s["rows_not_in_stream"] for s in acct["ledger"].values())
    doubled += ledger_extra
    learned = learning(acct["eval_curve"], baseline["accounting"]["eval_curve"] if baseline else None)
    rose = bool(learned) and all(v["final"] > v["first"] for v in learned.values())
    ep = acct["episodes"]
    # Stretches without a train step (a stalled swarm shows here), the last one up to the stop.
    steps = acct.pop("train_step_ts")
    stop = injector.t0 + wall_s
    gaps = sorted(
        ((b - a, a - injector.t0) for a, b in zip(steps, [*steps[1:], stop], strict=False)), reverse=True
    )
    report = (run_dir / "report.md").read_text() if (run_dir / "report.md").exists() else ""
    stopped = next((ln for ln in report.splitlines() if ln.startswith("Written")), "")
    checks = {
        "up exited 0": rc == 0,
        "lost = 0": not acct["lost"],
        "every dropped episode's models told (lost-episode records)": acct["lost_records_missing_count"] == 0,
        "doubled = 0": doubled == 0,
        "aborted / never-ended episodes without samples": not (acct["aborted_with_samples"] or acct["never_ended_with_samples"]),
        "eval episodes without samples": not acct["eval_with_samples"],
        "generated tokens = trainable tokens of the samples": not acct["token_mismatch"],
        "ledger rows = stream messages": ledger_missing == 0 and ledger_extra == 0,
        "no dead letters": not acct["dead_letters"],
        "every never-ended episode explained by a client kill": ep["never_ended_untouched_count"] == 0,
        "every fault recovered": all(r["recovered"] == r["faults"] for r in recovery.values()),
        "trained at most once": acct["training"].get("trained_twice", 0) == 0 if acct["training"]["measured"] else None,
        "every untrained sample accounted for": acct["training"].get("unaccounted", 0) == 0 if acct["training"]["measured"] else None,
        "restarted clients continued their task streams (no round begun twice)": not any(ep["rounds_replayed"].values()),
        "eval curve rose": rose,
        "final held-out success within 10 points of the best": all(v["final"] >= v["best"] - 0.1 for v in learned.values()) if learned else None,
    }  # fmt: skip
    if not args.no_faults:
        base_ep = baseline["accounting"]["episodes"] if baseline else None
        checks |= {
            "touched >= 30% of training episodes (client kills)": ep["touched_fraction"] >= 0.3,
            "final held-out success >= 0.9x the fault-free run's": all(v["base_final"] is not None and v["final"] >= 0.9 * v["base_final"] for v in learned.values()) if learned and baseline else None,
            "distinct instances per training episode >= 0.9x the fault-free run's": ep["distinct_per_episode"] >= 0.9 * base_ep["distinct_per_episode"] if base_ep else None,
        }  # fmt: skip
        if args.replicas > 1:  # a kill is covered by another replica (a standby trainer): in seconds
            medians = [r["recover_median_s"] for r in recovery.values() if r["faults"]]
            checks[f"every recover median <= {RECOVER_S:g} s"] = all(
                m is not None and m <= RECOVER_S for m in medians
            )
    return {
        "benchmark": "chaos",
        "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "up_command": shlex.join(up_cmd[1:]),
        "machine": machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "run_dir": str(run_dir),
        "up_returncode": rc,
        "up_stopped": stopped,
        "wall_s": round(wall_s, 1),
        "started_ts": injector.t0,
        "faults_per_kind": dict(Counter(f["kind"] for f in faults)),
        "restarts": restart_counts(run_dir),
        "lost": len(acct["lost"]),
        "doubled": doubled,
        "ledger_missing_rows": ledger_missing,
        "recovery": recovery,
        "eval_rose": rose,
        "learning": learned,
        "baseline": None
        if baseline is None
        else {
            "path": baseline.get("path"),
            "command": baseline["command"],
            "wall_s": baseline["wall_s"],
            "distinct_per_episode": baseline["accounting"]["episodes"]["distinct_per_episode"],
            "training_episodes": baseline["accounting"]["episodes"]["training"],
        },
        "longest_without_train_step": [{"s": round(g, 1), "from_t": round(t, 1)} for g, t in gaps[:3]],
        "checks": checks,
        "ok": all(v is True for v in checks.values()),
        "accounting": acct,
        "faults": faults,
        "live": {"begun": injector.begun, "touched": injector.touched},
    }


def learning(curve: list[dict[str, Any]], base: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Per (model, task) team outcome: first, final (the last version evaluated) and best held-out
    success, and the fault-free run's final (`base`: its eval curve; None without one)."""
    out: dict[str, dict[str, Any]] = {}
    for p in curve:
        if p["metric"] != "success":
            continue
        row = out.setdefault(f"{p['model']} {p['task']}", {"first": p["success"], "best": p["success"]})
        row.update(final=p["success"], final_version=p["step"], best=max(row["best"], p["success"]))
    for label, row in out.items():
        same = [
            p["success"]
            for p in base or []
            if p["metric"] == "success" and f"{p['model']} {p['task']}" == label
        ]
        row["base_final"] = same[-1] if same else None
    return out


def _lost_rows(a: dict[str, Any]) -> list[str]:
    """Where the lost episodes are (`chaos_accounting.lost_summary`), when there are any."""
    ls = a.get("lost_summary") or {}
    if not ls.get("count"):
        return []
    return [
        f"| lost: ended between (s after the first begin) | {ls['ended_t'][0]:.0f}-{ls['ended_t'][1]:.0f} |",
        f"| lost: events still queued for a merger at the stop (by partition) | {ls['queued_at_stop']} "
        f"{ls['queued_by_partition']} |",
    ]


def write_md(r: dict[str, Any], path: Path) -> None:
    m, a, ep = r["machine"], r["accounting"], r["accounting"]["episodes"]
    tr = a["training"]
    title = "without faults (the baseline)" if r["config"]["no_faults"] else "under SIGKILL"
    lines = [
        f"# Chaos benchmark: the default swarm on a 3-node JetStream cluster, {title}",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB, torch {m['torch']}, {m['nats_server']}, "
        f"{m['date']} (load average {m['load_average']} at the end). Command: `{r['command']}` "
        f"({r['wall_s']:.0f} s; `up` exit code {r['up_returncode']}; {r['up_stopped'] or 'no report'}).",
        "",
        f"`swarmrl {r['up_command']}` with `SWARMRL_STREAM_REPLICAS=3` and the merger's episode timeout at "
        f"{r['config']['episode_timeout_s']:g} s. "
        + (
            "No faults: the baseline the chaos run's learning checks compare with."
            if r["config"]["no_faults"]
            else f"Faults: clients SIGKILLed at random (busy ones, at most {r['config']['kills_per_window']} "
            f"kills per client per 120 s), each service SIGKILLed {r['config']['service_kills']}x and "
            f"{r['config']['node_kills']} node fault(s) (SIGKILL, {r['config']['node_down_s']:g} s down, "
            f"restart), seed {r['config']['seed']}."
        ),
        "",
        "## Checks",
        "",
        *checks_table(r["checks"]),
        "",
        f"**lost = {r['lost']}, doubled = {r['doubled']}.**",
        "",
        "## Faults and recovery",
        "",
        "Time to recover = from the SIGKILL to the restarted process's next observable output: merger the first "
        "merge stat once every partition the killed merger held has a new owner (a surviving replica or its "
        "restart; `covered` below: the takeover alone), trainer a train step (of its standby, with replicas), ledger a new Parquet part, "
        "gateway and engine an `llm` event, client its next `begin`; node: from its restart (it is held down "
        "on purpose) until back in the cluster with every stream's replica on it current (`/healthz` ok).",
        "",
        "| fault | injected | restarts by up | restarted after (median s) | recovered | recover median s | recover max s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    restarts = r["restarts"]
    for kind, rec in r["recovery"].items():
        n_restarts = sum(v for k, v in restarts.items() if k == kind or k.startswith(f"{kind}-"))
        n_restarts = n_restarts if kind != "nats-node" else rec["faults"]
        lines.append(
            f"| {kind} | {rec['faults']} | {n_restarts} | {_f(rec['restart_median_s'])} | {rec['recovered']} | "
            f"{_f(rec['recover_median_s'])} | {_f(rec['recover_max_s'])} |"
        )
    n = r["config"].get("replicas", 1)
    for kind in ("merger", "ledger", "gateway", "engine", "trainer"):
        covered = [
            f["covered_after_s"]
            for f in r["faults"]
            if f["kind"] == kind and f.get("covered_after_s") is not None
        ]
        what = {
            "merger": "the last of its partitions taken again",
            "ledger": "the last of its partitions taken again",
            "trainer": "the standby's next train step",
        }.get(kind, "the next llm event")
        if covered:
            lines += ["", f"{kind.capitalize()} kills covered (kill to {what}) after: "
                      f"{', '.join(f'{c:.1f}' for c in covered)} s ({n} replica(s))."]  # fmt: skip
    gaps = r["longest_without_train_step"]
    lines += [
        "",
        "Longest stretches without a train step: "
        + ", ".join(f"{g['s']:.0f} s from t={g['from_t']:.0f} s" for g in gaps)
        + " (the stretch after the last step runs to the stop).",
        "",
        f"Client kills touched {ep['touched_by_client_kills']} of {ep['training']} training episodes "
        f"(**{100 * ep['touched_fraction']:.1f}%**): open when their client was killed, they never ended.",
        "",
        "## Learning",
        "",
        f"Training episodes played **{ep['distinct_task_ids']} distinct task instances**, "
        f"**{ep['distinct_per_episode']:.4f} per episode** begun; groups begun again on a round an earlier "
        f"lifetime of their client had begun: {sum(ep['rounds_replayed'].values())}"
        + (
            f" (fault-free run of the same swarm: {r['baseline']['distinct_per_episode']:.4f} over "
            f"{r['baseline']['training_episodes']} episodes, `{r['baseline']['path']}`)."
            if r.get("baseline")
            else "."
        ),
        "",
        "| model task | first | final (version) | best | fault-free run's final |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[
            f"| {label} | {100 * v['first']:.1f}% | {100 * v['final']:.1f}% (v{v['final_version']}) | "
            f"{100 * v['best']:.1f}% | {_pct(v['base_final'])} |"
            for label, v in r["learning"].items()
        ],
        "",
        "## Accounting (streams and ledger)",
        "",
        "| what | count |",
        "| --- | ---: |",
        f"| training episodes begun | {ep['training']} |",
        f"| ended (`end`) | {ep['ended']} |",
        f"| ended, samples present exactly once (= merge stats' timelines, ids unique) | {a['ended_samples_exactly_once']} |",
        *[f"| ended, no samples: {k} | {v} |" for k, v in a["ended_without_samples_with_reason"].items()],
        f"| ended, lost (no samples and no reason) | {len(a['lost'])} |",
        *_lost_rows(a),
        f"| dropped episodes whose models got no lost-episode record | {a['lost_records_missing_count']} |",
        f"| aborted (`abort`) | {ep['aborted']} (with samples: {len(a['aborted_with_samples'])}) |",
        f"| never ended | {ep['never_ended']} (with samples: {len(a['never_ended_with_samples'])}; "
        f"merge status {ep['never_ended_by_merge_status']}) |",
        f"| never ended and not touched by a client kill | {ep['never_ended_untouched_count']} |",
        f"| eval episodes | {ep['eval']} (with samples: {len(a['eval_with_samples'])}) |",
        f"| samples | {a['samples']} |",
        *[f"| doubled {k} | {v} |" for k, v in a["doubled"].items()],
        f"| ended episodes whose generated tokens != trainable tokens of their samples | {len(a['token_mismatch'])} |",
    ]
    if tr["measured"]:
        lines += [
            f"| samples trained | {tr['trained']} (twice: {tr['trained_twice']}) |",
            *[f"| samples not trained: {k} | {v} |" for k, v in tr["dropped_by_reason"].items()],
            f"| samples pending in the trainer's consumer at stop | {tr['pending_at_stop']} |",
            f"| samples neither trained, dropped nor pending | {tr['unaccounted']} |",
        ]
    else:
        lines.append(f"| trained at most once / untrained accounted | not measured ({tr['why']}) |")
    lines += [
        f"| dead letters | {sum(a['dead_letters'].values())} {a['dead_letters'] or ''} |",
        "",
        "| stream | messages | ledger rows | ledger's own dead letters | missing | duplicate rows |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *[
            f"| {s} | {v['stream_messages']} | {v['ledger_rows']} | {v['ledger_dead_letters']} | {v['missing']} | "
            f"{v['duplicate_rows'] + v['rows_not_in_stream']} |"
            for s, v in a["ledger"].items()
        ],
        "",
        "## Eval curve (held-out success, temperature 1)",
        "",
        f"Rose: **{'yes' if r['eval_rose'] else 'no'}**.",
        "",
        "| model | task | version | success | n | minutes into the run |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    t0 = r.get("started_ts", min((f["ts"] - f["t"] for f in r["faults"]), default=None))
    for p in a["eval_curve"]:
        minutes = f"{(p['ts'] - t0) / 60:.1f}" if t0 is not None else "-"
        lines.append(
            f"| {p['model']} | {p['task']} {p['metric']} | {p['step']} | {100 * p['success']:.1f}% | {p['n']} | {minutes} |"
        )
    lines += ["", "## Every fault", "", "| t (s) | kind | target | open episodes | restarted after s | recovered after s |",
              "| ---: | --- | --- | ---: | ---: | ---: |"]  # fmt: skip
    for f in r["faults"]:
        lines.append(
            f"| {f['t']:.0f} | {f['kind']} | {f['target']} | {f.get('open_episodes', '')} | "
            f"{_f(f.get('restarted_after_s'))} | {_f(f.get('recovered_after_s'))} |"
        )
    path.write_text("\n".join(lines) + "\n")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


RECOVER_S = 10.0
"""With replicas, every kind of fault's median time to recover is at most this."""
SAME_SWARM = ("minutes", "clients", "concurrency", "episode_timeout_s", "replicas", "up_args")
"""What a fault-free run must share with a chaos run to be its baseline."""


def baseline_for(args: argparse.Namespace) -> dict[str, Any]:
    """The fault-free run to compare with: `--baseline PATH` as recorded, or (`auto`) the recorded
    `<out>/<name>-fault-free.json` when it ran the same swarm, else a new one, run now and written there."""
    ff_name = args.name
    path = args.out / f"{ff_name}-fault-free.json" if args.baseline == "auto" else Path(args.baseline)
    if path.exists():
        base = json.loads(path.read_text())
        recorded = {"replicas": 1} | base["config"]  # baselines recorded before --replicas had none
        differs = {
            k: (recorded.get(k), getattr(args, k)) for k in SAME_SWARM if recorded.get(k) != getattr(args, k)
        }
        if not differs:
            print(f"chaos: fault-free baseline {path}", flush=True)
            return base | {"path": str(path)}
        if args.baseline != "auto":
            raise SystemExit(f"--baseline {path} ran another swarm: {differs} (recorded, asked)")
        print(
            f"chaos: {path} ran another swarm ({differs}); running the fault-free baseline again", flush=True
        )
    elif args.baseline != "auto":
        raise SystemExit(f"--baseline {path}: no such file (write one with --no-faults)")
    else:
        print(f"chaos: no fault-free baseline at {path}; running it first ({args.minutes:g} min)", flush=True)
    base_args = argparse.Namespace(**{**vars(args), "no_faults": True, "name": path.stem, "out": path.parent})
    if args.work_dir is not None:
        base_args.work_dir = args.work_dir / "fault-free"
    base = record(base_args)
    return base | {"path": str(path)}


def record(args: argparse.Namespace, baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run, write `<out>/<name>.{json,md}`, print the failed checks; returns the result."""
    result = asyncio.run(run(args, baseline))
    path = write_json(args.name, result, args.out)
    write_md(result, args.out / f"{args.name}.md")
    failed = [k for k, v in result["checks"].items() if v is not True]
    print(
        f"chaos: wrote {path} and {args.name}.md; failed or unmeasured checks: {failed or 'none'}", flush=True
    )
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    baseline = None if args.no_faults else baseline_for(args)
    return 0 if record(args, baseline)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
