"""Whole-swarm throughput: today's code against an older commit, running the same `swarmrl up`.

    just bench-swarm REF [--config bench/peers/swarmrl.toml] [--minutes 3] [--rounds 2] [--name swarm]
    python bench/swarm.py --baseline REF [--config bench/peers/swarmrl.toml] [--minutes 3]
                          [--rounds 2] [--out bench/results] [--name swarm]

Each round runs `swarmrl up --config CONFIG --minutes M` twice, one after the other on an otherwise
idle machine: once with today's code (the installed package) and once with commit REF's (exported
with `git archive`, imported ahead of it: every process the run starts inherits it); the next round
swaps which goes first. The default configuration is the peer benchmark's swarm (`just up`'s
defaults, the tool in-process, no evaluation during the run), so what is measured is what races TRL.

Per run, from its ledger: finished episodes, LLM calls and trainer steps per second, counted from
the first episode event to the last optimizer step (startup is left out: it is the same work in
both); from /proc, sampled every 2 s: the CPU seconds of every process the run started (with their
children), reported per LLM call, so a process that got cheaper shows even where the machine's
total is the same. Writes `<out>/<name>.{json,md}` with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import REPO, RESULTS, baseline_tree, machine, proc_cpu_s, write_json

from swarmrl.machine import describe


def cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its waited-for children; 0 once it is gone."""
    try:
        return proc_cpu_s(pid, waited_children=True)
    except OSError:
        return 0.0


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (a trainer under `accelerate launch`, a vLLM server)."""
    out = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                out += descendants(int(child))
    except OSError:
        pass
    return out


def run_swarm(run_dir: Path, config: Path, minutes: float, code: Path | None) -> dict[str, Any]:
    """One `swarmrl up`; its rates from the ledger and its processes' CPU seconds."""
    run_dir = run_dir.resolve()  # the baseline's `up` runs in the baseline's tree (`cwd` below)
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "swarmrl.cli", "up", "--config", str(config), "--minutes", str(minutes),
           "--run-dir", str(run_dir), "--no-display"]  # fmt: skip
    cpu: dict[str, float] = {}
    t0 = time.time()
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        # `cwd`: `python -m` puts it first on sys.path, ahead of PYTHONPATH (this repo's root has `swarmrl/`)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=code or REPO)
        while proc.poll() is None:
            time.sleep(2)
            try:
                pids = json.loads((run_dir / "pids.json").read_text())
            except (OSError, ValueError):
                continue
            for name, pid in pids.items():  # a process's last reading before it exits is its total
                cpu[name] = max(cpu.get(name, 0.0), sum(cpu_s(p) for p in descendants(pid)))
    if proc.returncode != 0:
        raise SystemExit(
            f"swarmrl up failed ({proc.returncode}); see {run_dir.parent / f'{run_dir.name}.log'}"
        )
    from swarmrl.services.ledger.query import connect

    con = connect(run_dir)
    steps, last_step = con.execute("SELECT count(*), max(ts) FROM train_steps").fetchone()
    first = con.execute("SELECT min(ts) FROM events").fetchone()[0]
    calls, generated = con.execute("SELECT count(*), sum(n_output) FROM llm_calls").fetchone()
    episodes = con.execute("SELECT count(*) FROM episodes WHERE status = 'ok'").fetchone()[0]
    span = last_step - first
    return {
        "wall_s": round(time.time() - t0, 1),
        "span_s": round(span, 1),
        "startup_s": round(first - t0, 1),
        "episodes": episodes,
        "llm_calls": calls,
        "steps": steps,
        "episodes_per_s": episodes / span,
        "llm_calls_per_s": calls / span,
        "generated_tokens_per_s": (generated or 0) / span,
        "steps_per_min": steps / span * 60,
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_ms_per_call": {k: round(v / calls * 1000, 2) for k, v in cpu.items()},
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over rounds of each system, and today's over the baseline's."""
    out: dict[str, Any] = {}
    for system in ("today", "baseline"):
        mine = [r for r in runs if r["system"] == system]
        out[system] = {
            key: statistics.mean(r[key] for r in mine)
            for key in ("episodes_per_s", "llm_calls_per_s", "generated_tokens_per_s", "steps_per_min")
        }
        procs = sorted({p for r in mine for p in r["cpu_ms_per_call"]})
        out[system]["cpu_ms_per_call"] = {
            p: statistics.mean(r["cpu_ms_per_call"].get(p, 0.0) for r in mine) for p in procs
        }
    out["ratio"] = {k: out["today"][k] / out["baseline"][k] for k in out["today"] if k != "cpu_ms_per_call"}
    return out


def report(result: dict[str, Any]) -> str:
    s, m = result["summary"], result["machine"]
    lines = [
        "# Whole-swarm throughput: today against a baseline commit",
        "",
        f"{describe(m)}. Command: `{result['command']}`. Today: `{result['today']}`; baseline: "
        f"`{result['baseline']}`. Each round runs both, one after the other, alternating which goes "
        "first; rates are counted from the first episode event to the last optimizer step.",
        "",
        "| round | system | order | episodes/s | LLM calls/s | generated tok/s | steps/min | startup s |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['round']} | {r['system']} | {r['order']} | {r['episodes_per_s']:.2f} | "
            f"{r['llm_calls_per_s']:.2f} | {r['generated_tokens_per_s']:.0f} | {r['steps_per_min']:.1f} | "
            f"{r['startup_s']:.0f} |"
        )
    lines += ["", "Means over rounds, today / baseline:", ""]
    for key, ratio in s["ratio"].items():
        lines.append(f"- {key}: {s['today'][key]:.2f} / {s['baseline'][key]:.2f} = **{ratio:.3f}x**")
    lines += ["", "CPU milliseconds per LLM call, by process (mean over rounds):", "",
              "| process | baseline | today | today / baseline |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    today, base = s["today"]["cpu_ms_per_call"], s["baseline"]["cpu_ms_per_call"]
    for p in sorted(set(today) | set(base), key=lambda p: -base.get(p, 0.0)):
        a, b = base.get(p, 0.0), today.get(p, 0.0)
        lines.append(f"| {p} | {a:.1f} | {b:.1f} | {b / a:.2f}x |" if a else f"| {p} | - | {b:.1f} | - |")
    total_a, total_b = sum(base.values()), sum(today.values())
    lines.append(f"| all | {total_a:.1f} | {total_b:.1f} | {total_b / total_a:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git ref whose code runs beside today's")
    ap.add_argument("--config", type=Path, default=REPO / "bench" / "peers" / "swarmrl.toml",
                    help="swarm description both run (default: the peer benchmark's)")  # fmt: skip
    ap.add_argument("--minutes", type=float, default=3.0, help="budget of each run (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both runs (default 2)")
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "bench-swarm", help="run directories")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where swarm.{json,md} go")
    ap.add_argument("--name", default="swarm", help="file name of the results (default swarm)")
    args = ap.parse_args(argv)
    ref = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    head = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        systems = {"today": None, "baseline": baseline_tree(args.baseline, Path(tmp))}
        for k in range(args.rounds):
            order = list(systems) if k % 2 == 0 else list(systems)[::-1]
            for i, system in enumerate(order):
                run_dir = args.work / f"{system}-{k + 1}"
                shutil.rmtree(run_dir, ignore_errors=True)
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                print(f"round {k + 1}: {system} ...", file=sys.stderr, flush=True)
                r = run_swarm(run_dir, args.config.resolve(), args.minutes, systems[system])
                runs.append({"round": k + 1, "system": system, "order": "first" if i == 0 else "second", **r})
                print(f"  {r['episodes_per_s']:.2f} episodes/s, {r['steps_per_min']:.1f} steps/min",
                      file=sys.stderr, flush=True)  # fmt: skip
    result = {
        "machine": machine(),
        "command": "python bench/swarm.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "today": head,
        "baseline": f"{args.baseline} ({ref})",
        "config": str(args.config),
        "minutes": args.minutes,
        "runs": runs,
        "summary": summarize(runs),
    }
    write_json(args.name, result, args.out)
    (args.out / f"{args.name}.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
