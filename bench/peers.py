"""swarmrl against TRL's GRPOTrainer: the same model, task, reward, group size and machine.

    just trl-env                          # TRL in .venv-trl (once)
    python bench/peers.py [--minutes 10] [--rounds 2] [--out bench/results]

Each round runs both systems one after the other on an otherwise idle machine for the same
wall-clock budget, counted from the launch of each one's process (startup included); the second
round swaps which goes first (`--first` names round 1's first). swarmrl runs `swarmrl up --config
bench/peers/swarmrl.toml` (`just up`'s defaults, without evaluation during the run, keeping every
checkpoint, the tool in-process as TRL's, one pass per step as `just up`, 64 episodes in flight,
steps on the groups ready); TRL runs
`bench/peers/trl_grpo.py` in `.venv-trl` (its docstring says which settings it shares and why).
Both take swarmrl's group size, learning rate and completions per optimizer step from its trainer
defaults (`num_repeat = 8`, `lr = 1e-4`, `batch_groups = 4`: 32; swarmrl's steps take at most that,
the groups with unequal rewards ready when its trainer is free, `min_batch_groups = 1` in its swarm
file); `--batch 16`
gives both 16 (swarmrl `--batch-groups 2`, TRL `per_device_train_batch_size=16`).

Afterwards the same evaluation scores both: a checkpoint of each system from every minute of its
run (swarmrl: the newest version published by then; TRL: the one it saved at that minute) is
loaded into the embedded engine behind a gateway, and `swarmrl.agents.evaluate.evaluate` plays the
64 held-out questions 4 times each at temperature 1 (n = 256), as `just up`'s evaluator does, with
the same sampling seeds for every checkpoint (a checkpoint scored again scores the same).

Writes `peers.{json,md}` (held-out success against minutes, the throughputs of each run, and the
time each system needs to reach TRL's best) and `peers.png` (the curves).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json

from swarmrl.agents.evaluate import evaluate
from swarmrl.agents.sdk import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.machine import describe
from swarmrl.services.common import bus
from swarmrl.swarm import build, load, resolve_base
from tests.support.localstack import generation_stack

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SWARM_FILE = HERE / "peers" / "swarmrl.toml"
TRL_SCRIPT = HERE / "peers" / "trl_grpo.py"
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
SYSTEMS = ("swarmrl", "TRL")
"""The two systems a round runs (as runs name them)."""
EVAL_SAMPLES = 4
MAX_TOKENS = 48
_SWARM = build(load(SWARM_FILE), str(SWARM_FILE))
_TRAINER = _SWARM.trainer("policy")
GROUP_SIZE = _TRAINER.num_repeat
"""Completions of one prompt (a GRPO group), in both systems: swarmrl's `num_repeat`."""
BATCH = _TRAINER.batch_groups * GROUP_SIZE
"""Completions per optimizer step in both systems by default: swarmrl's `batch_groups` groups."""
LR = _TRAINER.lr
"""Learning rate of both systems: swarmrl's `lr` (TRL's own default is sized for billion-parameter models)."""


def base_model() -> Path:
    return resolve_base(_SWARM.models["policy"])


def run_swarmrl(
    run_dir: Path, minutes: float, every: float, base: Path, batch: int = BATCH
) -> dict[str, Any]:
    """`swarmrl up` for `minutes`; its checkpoints (the newest at every `every` seconds) and
    throughputs, from its ledger."""
    from swarmrl.services.ledger.query import connect

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cmd = [sys.executable, "-m", "swarmrl.cli", "up", "--config", str(SWARM_FILE), "--minutes", str(minutes),
           "--run-dir", str(run_dir), "--no-display", "--batch-groups", str(batch // GROUP_SIZE)]  # fmt: skip
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = time.time() - t0
    con = connect(run_dir)
    steps = con.execute(
        "SELECT step, ts, samples, tokens FROM train_steps WHERE model = 'policy' ORDER BY step"
    ).fetchall()
    first_event = con.execute("SELECT min(ts) FROM events").fetchone()[0]
    generated = con.execute("SELECT sum(n_output), count(*) FROM llm_calls").fetchone()
    episodes = con.execute("SELECT count(*) FROM episodes WHERE status = 'ok'").fetchone()[0]
    end = steps[-1][1] - t0 if steps else wall
    points = [{"version": 0, "t": first_event - t0, "path": str(base)}]
    for k in range(1, int(minutes * 60 / every) + 1):
        done = [s for s in steps if s[1] - t0 <= k * every]
        if done and done[-1][0] != points[-1]["version"]:
            points.append({"version": done[-1][0], "t": done[-1][1] - t0})
    if steps and steps[-1][0] != points[-1]["version"]:
        points.append({"version": steps[-1][0], "t": end})
    for p in points[1:]:
        p["path"] = str(run_dir / "checkpoints" / "policy" / f"step-{p['version']}")
    keep = {p["path"] for p in points}
    for step in (run_dir / "checkpoints" / "policy").glob("step-*"):  # ~20 MB each, one per step
        if str(step) not in keep:
            shutil.rmtree(step)
    return {
        "system": "swarmrl",
        "wall_s": wall,
        "train_s": end,
        "steps": len(steps),
        "completions": episodes,
        "trained_samples": sum(s[2] for s in steps),
        "trained_tokens": sum(s[3] for s in steps),
        "generated_tokens": int(generated[0] or 0),
        "llm_calls": int(generated[1] or 0),
        "points": points,
    }


def run_trl(out: Path, minutes: float, save_every: float, base: Path, batch: int = BATCH) -> dict[str, Any]:
    """TRL's GRPOTrainer for `minutes`; its checkpoints and throughputs, from its own log."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.time()
    cmd = [str(TRL_PYTHON), str(TRL_SCRIPT), "--model", str(base), "--out", str(out),
           "--minutes", str(minutes), "--t0", str(t0), "--save-every", str(save_every), "--batch", str(batch),
           "--group-size", str(GROUP_SIZE), "--lr", str(LR)]  # fmt: skip
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    with (out.parent / f"{out.name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    wall = time.time() - t0
    logs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in logs if "loss" in r]
    saved = [json.loads(line) for line in (out / "checkpoints.jsonl").read_text().splitlines()]
    points = [{"version": c["step"], "t": c["t"], "path": c["path"]} for c in saved]
    points[0]["path"] = str(base)  # step 0 is the base itself, as swarmrl's version 0
    # completions/mean_length counts every completion token (tool results included); num_tokens is
    # what the trainer consumed (prompt and completion)
    return {
        "system": "TRL",
        "wall_s": wall,
        "train_s": steps[-1]["t"] if steps else wall,
        "steps": len(steps),
        "completions": batch * len(steps),
        "trained_samples": batch * len(steps),
        "trained_tokens": int(steps[-1]["num_tokens"]) if steps else 0,
        "generated_tokens": int(sum(batch * r["completions/mean_length"] for r in steps)),
        "points": points,
    }


async def evaluate_dir(model_dir: Path) -> tuple[float, int]:
    """Held-out success of the model in `model_dir`, as `just up`'s evaluator measures it."""
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats").start()
        try:
            nc = await bus.connect(server.service_url, "peers-setup")
            await bus.ensure_streams(nc.jetstream())
            await nc.close()
            async with generation_stack(server, model_dir):
                swarm = await SwarmClient.connect(
                    server.service_url, client_id="evaluator", code_version="peers"
                )
                try:
                    out = await evaluate(
                        swarm,
                        "calculator",
                        "policy",
                        samples=EVAL_SAMPLES,
                        temperature=1.0,
                        max_tokens=MAX_TOKENS,
                    )
                finally:
                    await swarm.close()
        finally:
            server.stop()
    return out.success, out.episodes


def evaluate_run(run: dict[str, Any], cache: dict[str, tuple[float, int]]) -> None:
    for p in run["points"]:
        if p["path"] not in cache:
            t = time.time()
            cache[p["path"]] = asyncio.run(evaluate_dir(Path(p["path"])))
            print(f"  {run['system']} v{p['version']} at {p['t'] / 60:.1f} min: {cache[p['path']][0]:.1%} "
                  f"({time.time() - t:.0f} s)", flush=True)  # fmt: skip
        p["success"], p["n"] = cache[p["path"]]


LEVELS = (0.70, 0.75, 0.80, 0.85, 0.90)
"""Held-out success levels whose time to reach the report compares too (the best is one noisy point)."""


def first_reach(points: list[dict[str, Any]], target: float) -> float | None:
    return next((p["t"] for p in points if p["success"] >= target - 1e-9), None)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round: TRL's best and when it got there, when swarmrl first reached it, and the ratio."""
    rounds = []
    for r in sorted({run["round"] for run in runs}):
        ours = next(x for x in runs if x["round"] == r and x["system"] == "swarmrl")
        trl = next(x for x in runs if x["round"] == r and x["system"] == "TRL")
        best = max(trl["points"], key=lambda p: (p["success"], -p["t"]))
        reach = first_reach(ours["points"], best["success"])
        rounds.append({
            "round": r,
            "trl_best": best["success"], "trl_best_t": best["t"],
            "swarmrl_best": max(p["success"] for p in ours["points"]),
            "swarmrl_reaches_trl_best_t": reach,
            "ratio": None if reach is None else reach / best["t"],
            "levels": [
                {"level": level, "trl_t": first_reach(trl["points"], level), "swarmrl_t": first_reach(ours["points"], level)}
                for level in LEVELS
            ],
        })  # fmt: skip
    return {"rounds": rounds}


def throughput(run: dict[str, Any]) -> dict[str, float]:
    s = run["train_s"]
    return {
        "generated_tokens_per_s": run["generated_tokens"] / s,
        "trained_tokens_per_s": run["trained_tokens"] / s,
        "samples_per_s": run["trained_samples"] / s,
        "completions_per_s": run["completions"] / s,
        "steps_per_min": 60 * run["steps"] / s,
    }


def order(run: dict[str, Any]) -> str:
    """Where the run stood in its round: first, second, or run again after the other system's runs."""
    if run.get("rerun"):
        return "rerun after both of the other's"
    return "first" if run["first"] else "second"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"swarmrl": "tab:blue", "TRL": "tab:orange"}
    for run in runs:
        xs = [p["t"] / 60 for p in run["points"]]
        ys = [100 * p["success"] for p in run["points"]]
        ax.plot(xs, ys, marker="o", ms=3, color=colors[run["system"]], ls="-" if run["round"] == 1 else "--",
                label=f"{run['system']} (round {run['round']}, {order(run)})")  # fmt: skip
    ax.set_xlabel("minutes from launch (2 CPU cores)")
    ax.set_ylabel("held-out success, % (n=256, T=1)")
    ax.set_title("calculator, tiny model: swarmrl vs TRL GRPOTrainer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _swarm_batch(result: dict[str, Any]) -> str:
    """How many completions swarmrl's steps take, for the report: runs from before its trainer took the
    groups ready (`min_batch_groups`) took a fixed `batch_groups` per step."""
    least = result.get("min_batch_groups", 0)
    if least == 0:
        return "both systems, every step"
    guard = result.get("rollback_window") or 0
    return (
        "TRL every step, every group trained; swarmrl at most: its trainer takes the groups with unequal "
        f"rewards ready when it is free, at least `min_batch_groups = {least}` of them (`bench/peers/swarmrl.toml`)"
        + (
            f", and rolls back to an earlier version if the train reward of its last {guard} groups "
            "collapses (`rollback_window`)"
            if guard
            else ""
        )
    )


def _rounds_said(result: dict[str, Any]) -> str:
    n = len({x["round"] for x in result["runs"]})
    return "once" if n == 1 else f"{'twice' if n == 2 else f'{n} times'}, alternating which goes first"


def write_md(result: dict[str, Any], out: Path) -> None:
    m = result["machine"]
    rerun = {x["system"] for x in result["runs"] if x.get("rerun")}
    if "joined" in result:
        said = "; ".join(
            f"round {k}: `python bench/peers.py {' '.join(j['argv'])}`, {j['wall_s'] / 60:.0f} min, "
            f"{j['machine']['date'][:10]}, load average before {j['machine']['load_average']}"
            for k, j in enumerate(result["joined"], 1)
        )
        header = (
            f"{describe(m)}. Rounds run one invocation each, joined by "
            f"`python bench/peers.py {' '.join(result['argv'])}`: {said}. TRL {result['trl_version']}."
        )
    else:
        header = (
            f"{describe(m)}. Command: `python bench/peers.py {' '.join(result['argv'])}`; "
            f"{result['wall_s'] / 60:.0f} min"
            + (
                " in all"
                if result.get("ran", 1)
                else " (this invocation: it ran none, the runs came from earlier ones)"
            )
            + f". TRL {result['trl_version']}."
        )
    lines = [
        "# swarmrl vs TRL's GRPOTrainer: calculator, same model, same machine",
        "",
        header,
        "",
        "Both train the bootstrap `tiny` model (Qwen2, 1.8M parameters) from the same warm start on the "
        "`calculator` task: the same prompts and tool, the same reward (the task's own environment), "
        f"groups of {GROUP_SIZE}, {result.get('batch', BATCH)} completions per optimizer step ({_swarm_batch(result)}), "
        "temperature 1, "
        f"AdamW at {LR:g} constant, clip "
        "0.2/0.28, no KL, the tool run in-process. swarmrl: `just up`'s defaults without evaluation "
        "during the run, with the tool in its client processes instead of sandboxed and 64 episodes in flight "
        "with an engine batch of 32 (`bench/peers/swarmrl.toml` says why); TRL: its defaults otherwise (`bench/peers/trl_grpo.py` says which "
        "and why). Each system gets the same wall-clock budget from the launch of its process, one "
        f"after the other on an otherwise idle machine, {_rounds_said(result)}. The same "
        f"evaluation scores both afterwards: a checkpoint from every {result['eval_every']:g} s, {EVAL_SAMPLES} episodes of "
        "each of the 64 held-out questions at temperature 1 through the embedded engine and gateway, each "
        "episode sampling with its own seeds (`swarmrl.agents.evaluate.evaluate`): every checkpoint of "
        "both systems is scored on the same draws, and a checkpoint scored again scores the same.",
        "",
        *(
            [
                f"{' and '.join(sorted(rerun))}'s runs were done again after a change (below, with the runs they "
                "replace), on the same idle machine after both of the other system's runs.",
                "",
            ]
            if rerun
            else []
        ),
        "![curves](peers.png)",
        "",
        "## Time to TRL's best",
        "",
        "| round | TRL best | TRL reached it at | swarmrl reached it at | swarmrl / TRL time | swarmrl best |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["summary"]["rounds"]:
        reach = r["swarmrl_reaches_trl_best_t"]
        lines.append(
            f"| {r['round']} | {100 * r['trl_best']:.1f}% | {r['trl_best_t'] / 60:.1f} min | "
            + (f"{reach / 60:.1f} min | **{r['ratio']:.2f}x** |" if reach is not None else "never | - |")
            + f" {100 * r['swarmrl_best']:.1f}% |"
        )
    lines += [
        "",
        "Time to each level of held-out success (the first evaluated checkpoint at or above it): TRL's best "
        "is a single checkpoint, about 2 points of standard error high or low, so the ratio to it moves "
        "with the noise of one point; the levels below it show the same race where both curves climb.",
        "",
        "| round | level | TRL reached it at | swarmrl reached it at | swarmrl / TRL time |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["summary"]["rounds"]:
        for lv in r.get("levels", []):
            trl_t, ours_t = lv["trl_t"], lv["swarmrl_t"]
            ratio = f"{ours_t / trl_t:.2f}x" if trl_t and ours_t is not None else "-"
            lines.append(
                f"| {r['round']} | {100 * lv['level']:.0f}% | "
                + " | ".join("never" if t is None else f"{t / 60:.1f} min" for t in (trl_t, ours_t))
                + f" | {ratio} |"
            )
    for system in SYSTEMS:
        mine = [x for x in result["runs"] if x["system"] == system]
        best = [max(p["success"] for p in x["points"]) for x in mine]
        final = [x["points"][-1]["success"] for x in mine]
        lines.append(
            f"\n{system}: best {', '.join(f'{100 * b:.1f}%' for b in best)}; at the end of the budget "
            f"{', '.join(f'{100 * f:.1f}%' for f in final)} (round{'s' if len(mine) > 1 else ''} "
            f"{', '.join(str(x['round']) for x in mine)})."
        )
    lines += [
        "",
        "## Throughput",
        "",
        "Per second of the run up to its last optimizer step. *generated*: tokens the model sampled "
        "(swarmrl: the engine's output tokens of every LLM call; TRL: its completion lengths, which count "
        "the tool results inside a completion too); *trained*: tokens in the trained samples (swarmrl: "
        "merged timelines, each token once; TRL: prompt and completion of every completion); *samples*: "
        "trained sequences (swarmrl's are merged timelines, several calls each); *completions*: finished "
        "episodes (TRL: its completions).",
        "",
        "| round | system | order | steps | steps/min | completions/s | generated tok/s | trained tok/s | samples/s | final success |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in result["runs"]:
        t = throughput(run)
        lines.append(
            f"| {run['round']} | {run['system']} | {order(run)} | {run['steps']} | "
            f"{t['steps_per_min']:.1f} | {t['completions_per_s']:.2f} | {t['generated_tokens_per_s']:.0f} | "
            f"{t['trained_tokens_per_s']:.0f} | {t['samples_per_s']:.2f} | {100 * run['points'][-1]['success']:.1f}% |"
        )
    if result.get("superseded"):
        lines += [
            "",
            "## Runs replaced after a change (not evaluated)",
            "",
            "| round | system | what changed after it | steps | steps/min | completions/s | generated tok/s | trained tok/s |",
            "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for run in result["superseded"]:
            t = run["throughput"]
            lines.append(
                f"| {run['round']} | {run['system']} | {run['why']} | {run['steps']} | {t['steps_per_min']:.1f} | "
                f"{t['completions_per_s']:.2f} | {t['generated_tokens_per_s']:.0f} | {t['trained_tokens_per_s']:.0f} |"
            )
    lines += [
        "",
        "## The multi-turn environment example: TRL cannot play it as it is",
        "",
        "`examples/env/arithmetic.py` answers a wrong final answer with a user turn (a hint) and a second "
        "try (reward 1, 0.5 or 0). TRL's multi-turn rollouts (`GRPOTrainer(environment_factory=...)`, "
        f"TRL {result['trl_version']}) go on only while the model calls a tool: the environment's methods are "
        "the tools, a tool's result is the only message it can add, and a reply without a tool call ends the "
        "rollout (`_tool_call_loop`). The hint turn has no place there; the first try alone is the "
        "`calculator` task above with another question set. swarmrl's run of the example: "
        "`bench/results/up/env-20min.md`.",
    ]
    lines += ["", "## Every evaluated checkpoint", "",
              "| round | system | version (step) | minutes | success | n |", "| ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for run in result["runs"]:
        for p in run["points"]:
            lines.append(
                f"| {run['round']} | {run['system']} | {p['version']} | {p['t'] / 60:.1f} | "
                f"{100 * p['success']:.1f}% | {p['n']} |"
            )
    (out / "peers.md").write_text("\n".join(lines) + "\n")


def round_order(round_no: int, first: str) -> list[str]:
    """The two systems of round `round_no` (from 1) in the order they run: `first` goes first in the
    odd rounds, the other in the even ones."""
    [other] = [s for s in SYSTEMS if s != first]
    return [first, other] if round_no % 2 else [other, first]


def write_report(result: dict[str, Any], out: Path) -> None:
    """`out/peers.json`, `peers.png` and `peers.md` from one result."""
    write_json("peers", result, out)
    plot(result["runs"], out / "peers.png")
    write_md(result, out)


JOINED_SAME = ("trl_version", "minutes", "batch", "min_batch_groups", "rollback_window", "eval_every")
"""Settings every report joined into one must share."""


def join(results: list[dict[str, Any]], argv: list[str]) -> dict[str, Any]:
    """One report from the runs of several (rounds run as separate invocations, for example on
    different days), renumbered in the order given; settings that differ are refused."""
    for key in JOINED_SAME:
        values = {json.dumps(r.get(key)) for r in results}
        if len(values) > 1:
            raise SystemExit(f"--join: the reports differ in {key} ({', '.join(sorted(values))})")
    runs: list[dict[str, Any]] = []
    for res in results:
        offset = max((x["round"] for x in runs), default=0)
        runs += [{**x, "round": x["round"] + offset} for x in res["runs"]]
    first = results[0]
    return {
        **{key: first.get(key) for key in JOINED_SAME},
        "argv": argv,
        "machine": first["machine"],
        "joined": [{"argv": r["argv"], "wall_s": r["wall_s"], "machine": r["machine"]} for r in results],
        "wall_s": sum(r["wall_s"] for r in results),
        "ran": 0,
        "runs": runs,
        "throughput": [{"round": x["round"], "system": x["system"], **throughput(x)} for x in runs],
        "summary": summarise(runs),
        "superseded": [x for r in results for x in r.get("superseded", [])],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each run")
    p.add_argument(
        "--rounds", type=int, default=2, help="rounds of both systems, alternating which goes first"
    )
    p.add_argument("--first", choices=SYSTEMS, default="swarmrl",
                   help="the system that goes first in round 1 (and every odd round); the other goes first "
                   "in even rounds")  # fmt: skip
    p.add_argument(
        "--eval-every",
        type=float,
        default=60.0,
        help="seconds between evaluated checkpoints (TRL saves one then; swarmrl's newest then)",
    )
    p.add_argument("--batch", type=int, default=BATCH,
                   help=f"completions per optimizer step in both systems, a multiple of the group size "
                   f"{GROUP_SIZE} (swarmrl: batch_groups = batch / {GROUP_SIZE}; TRL: per_device_train_batch_size)")  # fmt: skip
    p.add_argument("--work", type=Path, default=Path("runs/peers"), help="run directories and logs")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--resume", action="store_true", help="keep the runs already in WORK/runs.json; run the rest"
    )
    p.add_argument("--rerun", choices=SYSTEMS,
                   help="with --resume: run this system's rounds again (after a change to it); the runs it "
                   "replaces are reported apart, with --why")  # fmt: skip
    p.add_argument("--why", default="", help="what changed, for the report of the replaced runs")
    p.add_argument(
        "--report-only", action="store_true", help="rewrite peers.md and peers.png from OUT/peers.json"
    )
    p.add_argument("--join", nargs="+", type=Path, metavar="PEERS_JSON",
                   help="write one report in OUT from the runs of these reports (one invocation each, "
                   "with the same settings), rounds numbered in the order given; runs nothing")  # fmt: skip
    a = p.parse_args(argv)
    if a.batch < GROUP_SIZE or a.batch % GROUP_SIZE:
        p.error(f"--batch {a.batch}: a positive multiple of the group size {GROUP_SIZE}")
    if a.join:
        write_report(
            join([json.loads(f.read_text()) for f in a.join], argv if argv is not None else sys.argv[1:]),
            a.out,
        )
        return 0
    if a.report_only:
        result = json.loads((a.out / "peers.json").read_text())
        result["summary"] = summarise(result["runs"])
        write_report(result, a.out)
        return 0
    if not TRL_PYTHON.exists():
        raise SystemExit(
            f"{TRL_PYTHON} not found: `just trl-env` installs TRL in its own virtual environment"
        )
    version = subprocess.run([str(TRL_PYTHON), "-c", "import trl; print(trl.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    a.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    before = machine()
    base = base_model()  # built now if it is not cached, outside every budget
    done = a.work / "runs.json"
    runs: list[dict[str, Any]] = json.loads(done.read_text()) if a.resume and done.exists() else []
    before_file = a.work / "superseded.json"
    superseded: list[dict[str, Any]] = json.loads(before_file.read_text()) if before_file.exists() else []
    other = sorted({x.get("batch", BATCH) for x in runs} - {a.batch})
    if other:
        raise SystemExit(
            f"{done} holds runs with {other} completions per step; --batch {a.batch} cannot join them"
        )
    if a.rerun:  # this system's runs are done again (after a change to it); the old ones are kept apart
        for run in [x for x in runs if x["system"] == a.rerun]:
            superseded.append({**run, "why": a.why})
            old = a.work / f"{'swarmrl' if a.rerun == 'swarmrl' else 'trl'}-{run['round']}"
            if old.exists():  # beside the ones an earlier rerun replaced, if any
                target, k = old.with_name(old.name + "-superseded"), 2
                while target.exists():
                    target, k = old.with_name(f"{old.name}-superseded-{k}"), k + 1
                old.rename(target)
        runs = [x for x in runs if x["system"] != a.rerun]
        before_file.write_text(json.dumps(superseded, indent=1))
        done.write_text(json.dumps(runs, indent=1))
    ran = 0
    for r in range(1, a.rounds + 1):
        for i, system in enumerate(round_order(r, a.first)):
            if any(x["round"] == r and x["system"] == system for x in runs):
                continue  # --resume: run before
            print(f"round {r}: {system} for {a.minutes:g} min", flush=True)
            if system == "swarmrl":
                run = run_swarmrl((a.work / f"swarmrl-{r}").resolve(), a.minutes, a.eval_every, base, a.batch)
            else:
                run = run_trl((a.work / f"trl-{r}").resolve(), a.minutes, a.eval_every, base, a.batch)
            run["batch"] = a.batch
            again = {"rerun": True} if a.rerun == system else {}  # after both of the other's runs
            runs.append({**run, "round": r, "first": i == 0, **again})
            ran += 1
            done.write_text(json.dumps(runs, indent=1))
    cache: dict[str, tuple[float, int]] = {}
    for run in runs:
        print(f"evaluating {run['system']} round {run['round']}", flush=True)
        evaluate_run(run, cache)
    result = {
        "argv": argv if argv is not None else sys.argv[1:],
        "machine": before,
        "trl_version": version,
        "minutes": a.minutes,
        "batch": a.batch,
        "min_batch_groups": _TRAINER.min_batch_groups,
        "rollback_window": _TRAINER.rollback_window,
        "eval_every": a.eval_every,
        "wall_s": time.time() - started,
        "ran": ran,
        "runs": runs,
        "throughput": [{"round": x["round"], "system": x["system"], **throughput(x)} for x in runs],
        "summary": summarise(runs),
        "superseded": [{**x, "throughput": throughput(x)} for x in superseded],
    }
    write_report(result, a.out)
    print((a.out / "peers.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
