"""`swarmrl up`: the whole swarm on one machine, training the default task until the budget is spent.

Starts NATS (embedded unless --nats), engine, gateway, merger, trainer, ledger and N example
clients as separate processes, plus an evaluator, shows live progress, and writes a run directory
with the Parquet ledger, `report.md` and a reward/eval curve PNG. Ctrl-C (or `swarmrl down`) stops
everything cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from swarmrl.infra.nats_server import NatsServer, free_port
from swarmrl.supervisor import Supervisor

log = logging.getLogger("swarmrl.up")
PID_FILE = Path("runs/.up.pid")
MODEL = "policy"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="swarmrl up", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--steps",
        type=int,
        default=300,
        help="trainer steps to run (the run also stops when --minutes is spent)",
    )
    p.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget; stops early when spent")
    p.add_argument(
        "--task", default="calculator", help="task(s) to train, comma-separated: calculator, guess_number"
    )
    p.add_argument("--model", default="", help="HF model dir to train (default: the bootstrapped tiny model)")
    p.add_argument("--clients", type=int, default=2, help="example client processes")
    p.add_argument("--concurrency", type=int, default=2, help="GRPO groups each client plays at once")
    p.add_argument("--num-repeat", type=int, default=8, help="episodes per group (GRPO group size)")
    p.add_argument("--batch-groups", type=int, default=4, help="groups per trainer step")
    p.add_argument("--lr", type=float, default=1e-4, help="trainer learning rate")
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=512,
        help="trainer packed-row length; longer samples are truncated. Small rows are fastest on CPU "
        "(attention over a packed row is quadratic in its length); raise it for long episodes or on GPU",
    )
    p.add_argument(
        "--max-backlog",
        type=int,
        default=-1,
        help="gateway admission control: hold new groups while this many samples wait for the trainer "
        "(-1 = two trainer steps' worth, 0 = off)",
    )
    p.add_argument("--eval-every", type=int, default=10, help="evaluate every N model versions")
    p.add_argument(
        "--eval-limit", type=int, default=0, help="eval instances per task (0 = the whole held-out set)"
    )
    p.add_argument(
        "--eval-samples", type=int, default=4, help="episodes per held-out instance (success is their mean)"
    )
    p.add_argument(
        "--eval-temperature",
        type=float,
        default=1.0,
        help="eval sampling temperature: 1.0 measures the policy being trained, 0 is greedy",
    )
    p.add_argument("--max-tokens", type=int, default=48, help="max tokens per model reply")
    p.add_argument(
        "--abort-rate", type=float, default=0.0, help="chaos: per-turn probability a client fails an episode"
    )
    p.add_argument(
        "--trainer-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra flag for the trainer, repeatable (e.g. --trainer-arg=--group-timeout-s=30); "
        "see `swarmrl serve trainer --help`",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/<timestamp>)")
    p.add_argument("--nats", default="", help="join this NATS cluster (service URL) instead of starting one")
    p.add_argument("--agent-nats", default="", help="agent-credential URL for clients (with --nats)")
    p.add_argument("--no-display", action="store_true", help="plain log lines instead of the live table")
    args = p.parse_args(argv)
    _check(p, args)
    return args


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad flags before anything starts (argparse exits with status 2 and the message)."""
    from swarmrl.agents.tasks import TASKS

    unknown = [t for t in args.task.split(",") if t not in TASKS]
    if unknown:
        p.error(f"--task: unknown task(s) {unknown}; known: {', '.join(sorted(TASKS))}")
    at_least = {
        "--steps": (args.steps, 1),
        "--clients": (args.clients, 1),
        "--concurrency": (args.concurrency, 1),
        "--num-repeat": (args.num_repeat, 2),
        "--batch-groups": (args.batch_groups, 1),
        "--eval-every": (args.eval_every, 1),
        "--eval-limit": (args.eval_limit, 0),
        "--eval-samples": (args.eval_samples, 1),
        "--max-tokens": (args.max_tokens, 1),
        "--micro-batch-tokens": (args.micro_batch_tokens, 2),
        "--max-backlog": (args.max_backlog, -1),
    }
    for flag, (value, low) in at_least.items():
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    if args.minutes <= 0 or args.lr <= 0 or args.eval_temperature < 0:
        p.error("--minutes and --lr must be > 0, --eval-temperature >= 0")
    if not 0 <= args.abort_rate < 1:
        p.error(f"--abort-rate must be in [0, 1), got {args.abort_rate}")


def make_run_dir(arg: Path | None) -> Path:
    run_dir = arg or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    latest = run_dir.parent / "latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_dir.resolve())
    return run_dir


def spawn_services(
    sup: Supervisor,
    args: argparse.Namespace,
    run_dir: Path,
    model_dir: Path,
    service_url: str,
    agent_url: str,
) -> None:
    # One torch thread each: engine and trainer share the cores, and oversubscribing them was ~4x slower.
    env = {
        "SWARMRL_NATS": service_url,
        "SWARMRL_SECRET": secrets.token_urlsafe(32),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    engine_port, gateway_port = free_port(), free_port()
    serve = ["-m", "swarmrl.cli", "serve"]
    sup.spawn("ledger", [*serve, "ledger", "--run-dir", str(run_dir)], env)
    sup.spawn(
        "engine",
        [*serve, "engine", "--model", MODEL, "--model-path", str(model_dir), "--port", str(engine_port)],
        env,
    )
    sup.spawn("merger", [*serve, "merger"], env)
    sup.spawn(
        "trainer",
        [
            *serve,
            "trainer",
            "--model",
            MODEL,
            "--model-path",
            str(model_dir),
            "--run-dir",
            str(run_dir),
            "--num-repeat",
            str(args.num_repeat),
            "--batch-groups",
            str(args.batch_groups),
            "--lr",
            str(args.lr),
            "--max-steps",
            str(args.steps),
            "--max-tokens-per-micro-batch",
            str(args.micro_batch_tokens),
            *args.trainer_arg,
        ],
        env,
    )
    sup.spawn(
        "gateway",
        [
            *serve,
            "gateway",
            "--engine",
            f"{MODEL}=http://127.0.0.1:{engine_port}",
            "--port",
            str(gateway_port),
            "--max-backlog",
            str(args.max_backlog if args.max_backlog >= 0 else 2 * args.batch_groups * args.num_repeat),
        ],
        env,
    )
    for i in range(args.clients):
        client = ["-m", "swarmrl.agents.runner", "--nats", agent_url, "--task", args.task, "--model", MODEL]
        client += ["--num-repeat", str(args.num_repeat), "--concurrency", str(args.concurrency)]
        client += [
            "--seed",
            str(1000 + i),
            "--max-tokens",
            str(args.max_tokens),
            "--abort-rate",
            str(args.abort_rate),
        ]
        sup.spawn(f"client-{i}", client, {"PYTHONUNBUFFERED": "1"})
    (run_dir / "pids.json").write_text(json.dumps({n: p.pid for n, p in sup.procs.items()}))


async def supervise(args: argparse.Namespace, sup: Supervisor, service_url: str, run_dir: Path) -> str:
    """Run the evaluator and the progress display until the budget is spent; return why it ended."""
    from swarmrl.agents.evaluate import run_evaluator
    from swarmrl.progress import Progress

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    progress = Progress(service_url, MODEL, args.steps, live=not args.no_display)
    await progress.start()
    evaluator = asyncio.create_task(
        run_evaluator(
            service_url,
            args.task.split(","),
            MODEL,
            stop,
            every=args.eval_every,
            limit=args.eval_limit,
            samples=args.eval_samples,
            temperature=args.eval_temperature,
            max_tokens=args.max_tokens,
            final=args.steps,
        )
    )
    deadline = time.monotonic() + args.minutes * 60
    reason = "interrupted"
    try:
        while not stop.is_set():
            dead = {n: rc for n, rc in sup.dead().items() if n != "trainer"}
            if dead:
                reason = f"process exited unexpectedly: {dead} (logs in {run_dir / 'logs'})"
                break
            if progress.step >= args.steps or "trainer" in sup.dead():
                reason = f"trainer finished {progress.step} steps"
                # one last eval of the final version, unless it is already running or done
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        progress.eval_seen(args.steps, len(args.task.split(","))), timeout=300
                    )
                break
            if time.monotonic() > deadline:
                reason = f"time budget of {args.minutes} min spent at step {progress.step}"
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            progress.render()
    finally:
        stop.set()
        evaluator.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await evaluator
        await progress.stop()
    return reason


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from swarmrl.log import setup_logging

    setup_logging("up")
    run_dir = make_run_dir(args.run_dir)
    if args.model:
        model_dir = Path(args.model)
    else:
        from swarmrl.bootstrap import ensure_default_model

        model_dir = ensure_default_model()
    server = None
    if args.nats:
        service_url, agent_url = args.nats, args.agent_nats or args.nats
    else:
        server = NatsServer(store_dir=run_dir / "nats", log_file=run_dir / "logs" / "nats.log").start()
        service_url, agent_url = server.service_url, server.agent_url
    PID_FILE.parent.mkdir(parents=True, exist_ok=True)
    PID_FILE.write_text(str(os.getpid()))
    sup = Supervisor(run_dir / "logs")
    print(
        f"swarmrl up: run dir {run_dir}  (logs in {run_dir / 'logs'}; stop with Ctrl-C or `swarmrl down`)",
        flush=True,
    )
    reason = "?"
    try:
        asyncio.run(_bootstrap_streams(service_url))
        spawn_services(sup, args, run_dir, model_dir, service_url, agent_url)
        reason = asyncio.run(supervise(args, sup, service_url, run_dir))
    finally:
        clients = [n for n in sup.procs if n.startswith("client")]
        sup.stop(clients)
        sup.stop(["gateway", "trainer", "merger", "engine"], timeout=30)
        sup.stop(["ledger"], timeout=30)  # last, so it flushes everything the others produced
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            PID_FILE.unlink()
    from swarmrl.report import write_report

    report = write_report(run_dir, reason=reason)
    print(f"swarmrl up: stopped ({reason}). Report: {report}", flush=True)
    return 0 if "unexpectedly" not in reason else 1


async def _bootstrap_streams(url: str) -> None:
    from swarmrl.services.common import bus

    nc = await bus.connect(url, "up")
    await bus.ensure_streams(nc.jetstream())
    await nc.close()


def down(argv: list[str] | None = None) -> int:
    """`swarmrl down`: ask a running `swarmrl up` (started from this directory) to stop."""
    if not PID_FILE.exists():
        print("swarmrl down: no running swarm found (runs/.up.pid missing)", file=sys.stderr)
        return 1
    pid = int(PID_FILE.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        PID_FILE.unlink()
        print(f"swarmrl down: process {pid} is gone; removed the stale pid file", file=sys.stderr)
        return 1
    print(f"swarmrl down: asked swarmrl up (pid {pid}) to stop")
    return 0
