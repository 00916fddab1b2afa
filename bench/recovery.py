"""Where a trainer's recovery after SIGKILL goes: the replicated swarm of `just chaos --replicas 2` (a
3-node JetStream cluster, two of each service but the trainer) trains, and its trainer is SIGKILLed
`--kills` times; for each kill a timeline from the kill to the next train step.

    python bench/recovery.py [--kills 2] [--gap-s 120] [--replicas 2] [--out bench/results]

Per kill: the restart (`up`'s supervisor: the new pid in `pids.json`), the new process's start (its
`/proc` start time), `starting at step` in its log (imports, model loaded, NATS connected, consumer
bound), the first redelivery on the trainer's durable consumer (what the dead trainer held comes back
`ack_wait_s` after its last in-progress signal) and the next train step (`swarm.metrics.train.*`).
Sampled every 0.5 s around each kill: the consumer's unacked (`num_ack_pending`) and undelivered
(`num_pending`) samples, their sum being the backlog the gateway's admission bound reads, and the
episodes begun per 5 s (new groups wait while that backlog is at the bound). Writes
`<out>/<name>.json` and `<out>/<name>.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json
from chaos_faults import read_pids, running
from nats.aio.msg import Msg

from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from tests.support.nats_cluster import NatsCluster

STARTED = "starting at step"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--kills", type=int, default=2, help="SIGKILLs of the trainer")
    add(
        "--gap-s",
        type=float,
        default=120.0,
        help="seconds from a kill to the next (and from the last to the stop)",
    )
    add(
        "--warmup-s",
        type=float,
        default=30.0,
        help="seconds after the first train step before the first kill",
    )
    add("--replicas", type=int, default=2, help="replicas of merger, ledger, gateway and engine")
    add("--work-dir", type=Path, default=None)
    add("--out", type=Path, default=RESULTS)
    add("--name", default="recovery-trainer")
    return p.parse_args(argv)


def proc_start(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from /proc."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(
            int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def log_times(path: Path, needle: str) -> list[float]:
    """Epoch times of the log lines holding `needle` (`setup_logging`'s asctime, local time)."""
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if needle in line:
            with contextlib.suppress(ValueError):
                out.append(dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


class Watch:
    """Train steps and begins as they come; the trainer consumer's state every 0.5 s."""

    def __init__(self, url: str) -> None:
        self.url, self.steps, self.begins, self.samples = url, list[float](), list[float](), list[dict]()
        self.durable = S.durable_name("trainer", S.SAMPLES_STREAM, "policy")
        self.stepped = asyncio.Event()

    async def start(self) -> None:
        self.nc = await bus.connect(self.url, "recovery-probe")
        self.js = self.nc.jetstream()
        await self.nc.subscribe(f"{S.METRICS_PREFIX}.train.>", cb=self._step)
        await self.nc.subscribe(S.episode_filter("*", "begin"), cb=self._begin)
        self.task = asyncio.create_task(self._sample())

    async def _step(self, msg: Msg) -> None:
        self.steps.append(time.time())
        self.stepped.set()

    async def _begin(self, msg: Msg) -> None:
        self.begins.append(time.time())

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                info = await self.js.consumer_info(S.SAMPLES_STREAM, self.durable, timeout=2)
                self.samples.append({"ts": time.time(), "ack_pending": info.num_ack_pending,
                                     "pending": info.num_pending, "redelivered": info.num_redelivered})  # fmt: skip
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.nc.close()


def timeline(kill: float, pid: int, run_dir: Path, w: Watch, gap_s: float) -> dict[str, Any]:
    """Seconds from `kill` to each mark, and the consumer and begins around it."""
    pids = read_pids(run_dir)
    new = pids.get("trainer")
    after = [s for s in w.samples if kill <= s["ts"] < kill + gap_s]
    before = [s for s in w.samples if kill - 5 <= s["ts"] < kill]
    at_kill = before[-1] if before else (after[0] if after else {})
    redelivered = next((s["ts"] for s in after if s["redelivered"] > at_kill.get("redelivered", 0)), None)
    step = next((t for t in w.steps if t > kill), None)
    ready = next((t for t in log_times(run_dir / "logs" / "trainer.log", STARTED) if t > kill), None)
    started = proc_start(new) if new and new != pid else None

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - kill, 2)

    buckets = {
        f"{b:+d}": sum(kill + b <= t < kill + b + 5 for t in w.begins) for b in range(-30, int(gap_s) - 5, 5)
    }
    series = [
        {"t": rel(s["ts"]), "ack_pending": s["ack_pending"], "pending": s["pending"]} for s in after[::4]
    ]
    return {
        "kill_ts": kill, "old_pid": pid, "new_pid": new,
        "process_started_s": rel(started), "ready_s": rel(ready), "first_redelivery_s": rel(redelivered),
        "next_step_s": rel(step), "at_kill": at_kill, "begins_per_5s": buckets, "consumer_every_2s": series,
    }  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = args.work_dir or Path("runs") / f"recovery-{dt.datetime.now():%Y%m%d-%H%M%S}"
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    cluster = NatsCluster(work / "nats").start()
    minutes = (args.warmup_s + 120 + args.kills * args.gap_s + 30) / 60
    config = work / "replicas.toml"
    config.write_text('[models.policy]\nbase = "tiny"\n\n[tasks.calculator]\n\n[replicas]\n'
                      + "".join(f"{s} = {args.replicas}\n" for s in ("merger", "ledger", "gateway", "engine")))  # fmt: skip
    cmd = [sys.executable, "-m", "swarmrl.cli", "up", "--nats-conf", str(cluster.conf_dir), "--run-dir", str(run_dir),
           "--no-display", "--minutes", f"{minutes:.2f}", "--steps", "100000", "--clients", "3", "--concurrency", "8",
           "--config", str(config)]  # fmt: skip
    env = (
        os.environ
        | {"SWARMRL_NATS": cluster.service_url, "SWARMRL_STREAM_REPLICAS": "3"}
        | cluster.password_env
    )
    w, kills, up = Watch(cluster.service_url), list[dict](), None
    try:
        log = await asyncio.to_thread(open, work / "up.log", "ab")
        with log:  # the child keeps its own copy of the descriptor
            up = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=log, env=env)
        await w.start()
        t0 = time.time()
        await asyncio.wait_for(w.stepped.wait(), timeout=600)
        print(f"recovery: first step {time.time() - t0:.0f} s after the start", flush=True)
        await asyncio.sleep(args.warmup_s)
        for i in range(args.kills):
            pid = read_pids(run_dir).get("trainer")
            if not pid or not running(pid):
                raise RuntimeError(f"no running trainer to kill: pids {read_pids(run_dir)}")
            kill = time.time()
            os.kill(pid, signal.SIGKILL)
            print(f"recovery: kill {i + 1} of trainer pid {pid}", flush=True)
            await asyncio.sleep(args.gap_s)
            kills.append(timeline(kill, pid, run_dir, w, args.gap_s))
            print(
                f"recovery: {json.dumps({k: v for k, v in kills[-1].items() if k.endswith('_s')})}",
                flush=True,
            )
    finally:
        await w.close()
        if up is not None and up.returncode is None:
            up.send_signal(signal.SIGINT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(up.wait(), 120)
            if up.returncode is None:
                up.kill()
        cluster.stop()
    return {"benchmark": "recovery-trainer", "command": " ".join(["bench/recovery.py", *sys.argv[1:]]),
            "machine": machine(), "config": {k: str(v) for k, v in vars(args).items()}, "kills": kills,
            "median_s": {k: _median([x[k] for x in kills]) for k in
                         ("process_started_s", "ready_s", "first_redelivery_s", "next_step_s")}}  # fmt: skip


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 2) if vals else None


def write_md(r: dict[str, Any], path: Path) -> None:
    m = r["machine"]
    lines = [
        "# Where the trainer's recovery after SIGKILL goes", "",
        f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['nats_server']}, {m['date']}. "
        f"Command: `{r['command']}`. {__doc__.split(chr(10) + chr(10))[2].strip()}", "",
        "| kill | new process started | ready (`starting at step`) | first redelivery | next train step | "
        "unacked at the kill | undelivered at the kill |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for i, k in enumerate(r["kills"], 1):
        a = k["at_kill"]
        lines.append(f"| {i} | {k['process_started_s']} | {k['ready_s']} | {k['first_redelivery_s']} | "
                     f"{k['next_step_s']} | {a.get('ack_pending')} | {a.get('pending')} |")  # fmt: skip
    md = r["median_s"]
    lines += [f"| median | {md['process_started_s']} | {md['ready_s']} | {md['first_redelivery_s']} | "
              f"{md['next_step_s']} | | |", ""]  # fmt: skip
    for i, k in enumerate(r["kills"], 1):
        lines += [f"Kill {i}: episodes begun per 5 s from 30 s before: "
                  + ", ".join(f"{t}: {n}" for t, n in k["begins_per_5s"].items()) + "; consumer "
                  "(s: unacked/undelivered): " + ", ".join(f"{s['t']}: {s['ack_pending']}/{s['pending']}"
                                                           for s in k["consumer_every_2s"]) + ".", ""]  # fmt: skip
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    r = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.name, r, args.out)
    write_md(r, args.out / f"{args.name}.md")
    print(json.dumps(r["median_s"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
