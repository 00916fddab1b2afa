"""`swarmrl up`: the whole swarm on one machine, training until the budget is spent, then a final
evaluation of the policy it ends with.

Starts NATS (embedded unless --nats), per model an engine and a trainer, a gateway, merger and
ledger (with `--track` the tracker, exporting every metric under `<run dir>/track/`), each task's
clients and an evaluator; shows live progress and writes a run directory with the Parquet ledger,
`report.md` and curve PNGs. Ctrl-C (or `swarmrl down`) stops everything cleanly.

The swarm is described by `--config swarm.toml` (see `swarmrl/swarm.py` and `examples/`), or by the
flags alone (one model `policy`, `--task` with optional weights); flags override the file. Outside
agents join with `<run dir>/connect.json` (owner-only; see the README, "Bring your own agent").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from swarmrl.control import DRAIN_S, GRACE_S
from swarmrl.core import rundir
from swarmrl.core.config import config_dict, password_on_command_line
from swarmrl.core.log import setup_logging
from swarmrl.core.rundir import PARTS_FILE, SWARM_FILE
from swarmrl.infra.credentials import OPERATOR
from swarmrl.infra.nats_server import NatsServer, role_urls
from swarmrl.overrides import FLAGS, add_flags, resolve
from swarmrl.services.common.tasks import wait_set
from swarmrl.supervisor import Supervisor
from swarmrl.swarm import Swarm, SwarmConfigError

if TYPE_CHECKING:
    from swarmrl.launch import AgentIds
    from swarmrl.progress import Progress

log = logging.getLogger("swarmrl.up")
FINAL_EVAL_S = 900.0
"""Longest wait for the final evaluation after the run ended (a whole held-out set, machine idle)."""
CATCH_UP_S = 10.0
"""Longest wait, once a trainer exited, for the progress feed to hear its last step."""
SHUTDOWN: list[tuple[frozenset[str], float]] = [
    (frozenset({"client"}), DRAIN_S + GRACE_S),  # they drain (finish or abort their groups)
    (frozenset({"gateway", "trainer", "merger", "engine", "actions"}), 30.0),
    (frozenset({"ledger", "tracker"}), 30.0),  # last, so they take everything the others produced
]
"""The order in which `up` stops its processes, by role (the embedded nats-server goes last)."""


def build_parser() -> argparse.ArgumentParser:
    """The flags that change the description (`overrides.FLAGS`), then where and how this run goes."""
    p = argparse.ArgumentParser(
        prog="swarmrl up", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_flags(p)
    add = p.add_argument
    add("--print-config", action="store_true",
        help="print the resolved configuration of every process as JSON and exit")  # fmt: skip
    add("--run-dir", type=Path, default=None, help="run directory (default runs/<timestamp>)")
    add("--resume", type=Path, default=None, metavar="RUN",
        help="continue the stopped run in directory RUN from its last version: its description "
        "(RUN/swarm.json), checkpoints, NATS streams, ledger and report go on; flags still apply "
        "(give --steps beyond the steps it reached, --minutes for this part)")  # fmt: skip
    add("--nats", default=os.environ.get("SWARMRL_NATS", ""),
        help="join this NATS cluster (service URL, default $SWARMRL_NATS) instead of starting one; "
        "a URL with a password goes in the environment, never on the command line")  # fmt: skip
    add("--nats-conf", type=Path, default=None,
        help="with --nats: the conf dir of those servers (their accounts.conf includes agents.conf from "
        "it), where up mints one NATS identity per client; see `swarmrl credentials --help`")  # fmt: skip
    add("--no-display", action="store_true", help="plain log lines instead of the live table")
    return p


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Swarm]:
    """`up`'s arguments and the one swarm they describe (a bad flag or description exits 2)."""
    p = build_parser()
    args = p.parse_args(argv)
    if reason := password_on_command_line(argv):
        p.error(reason)
    if args.nats and args.nats_conf is None:
        p.error("--nats needs --nats-conf DIR: the conf dir where up mints its clients' NATS identities")
    if args.resume is not None:
        if reason := resume_problem(args):
            p.error(reason)
        args.run_dir = args.resume
    elif args.run_dir is not None and (args.run_dir / SWARM_FILE).is_file():  # no silent resume
        p.error(f"--run-dir {args.run_dir} holds a run already; give --resume {args.run_dir} to go on with it, "
                "or a new --run-dir")  # fmt: skip
    given = {f: v for f in FLAGS if (v := getattr(args, f)) not in (None, [], "")}  # others: the file's
    try:
        return args, resolve(given, args.resume)
    except SwarmConfigError as exc:  # the description's own words, without the usage screen
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def resume_problem(args: argparse.Namespace) -> str | None:
    """Why `--resume` cannot go with these flags or this directory (None: it can)."""
    run = args.resume
    clash = [f for f, v in (("--config", args.config), ("--model", args.model), ("--task", args.task),
                            ("--run-dir", args.run_dir)) if v]  # fmt: skip
    if clash:
        return f"--resume takes the run's own description and directory; drop {', '.join(clash)}"
    if not (run / SWARM_FILE).is_file():
        return f"--resume {run}: no {SWARM_FILE} there, so it is not a run directory of `swarmrl up`"
    if rundir.pid_file(run).is_file():
        pid, started = rundir.read_pid(rundir.pid_file(run))
        if started is not None and rundir.start_time(pid) == started:
            return f"--resume {run}: that run is still going (pid {pid}); stop it first (`swarmrl down --run-dir {run}`)"
    return None


async def supervise(
    swarm: Swarm,
    sup: Supervisor,
    service_url: str,
    run_dir: Path,
    clients: dict[str, list[str]],
    ids: AgentIds,
    live: bool = True,
) -> str:
    """Run the evaluator, the control plane and the progress display (`live`: the table, else log
    lines) until the budget is spent; return why it ended."""
    import signal

    # Before the slow imports below: a Ctrl-C meanwhile would otherwise skip the clean stop.
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)

    from swarmrl.agents.evaluate import run_evaluator
    from swarmrl.agents.tasks import TASKS
    from swarmrl.control import start_control
    from swarmrl.progress import Progress

    run = swarm.run
    progress = Progress(service_url, list(swarm.models), run.steps, live=live)
    await progress.start()
    evaluated = {name: t.roles for name, t in swarm.tasks.items() if t.eval and name in TASKS}
    finish = asyncio.Event()
    evaluator = asyncio.create_task(
        run_evaluator(
            service_url, evaluated, stop, every=run.eval_every, limit=run.eval_limit,
            samples=run.eval_samples, temperature=run.eval_temperature, finish=finish,
            max_tokens={task: swarm.max_tokens(task) for task in evaluated},
        )
    )  # fmt: skip
    trainers = sup.having({"trainer"})
    deadline = time.monotonic() + run.minutes * 60
    reason = "interrupted"
    ended = False  # on its own (budget spent, a trainer finished), not by Ctrl-C or a crash loop
    started = time.time()

    def status() -> dict[str, Any]:
        return {
            "run_dir": str(run_dir), "uptime_s": round(time.time() - started, 1), "processes": sup.pids(),
            "restarts": dict(sup.restarts), "progress": progress.cells(),
        }  # fmt: skip

    control = await start_control(sup, swarm, run_dir, clients, ids, service_url, status, stop.set)
    try:
        while not stop.is_set():
            # a trainer that exits 0 has reached its steps: not restarted; other exits are
            if crash_loop := sup.heal(lambda name, rc: name in trainers and rc == 0):
                reason = crash_loop
                break
            if failing := progress.failing():  # a mistake in the task's code: nothing will train
                reason = failing
                break
            # The first trainer to finish ends the run: in a team its partner could not go on alone.
            if progress.done() or any(sup.dead().get(t) == 0 for t in trainers):
                # after a NATS restart the progress feed may still be catching up on the last step
                caught_up = time.monotonic() + CATCH_UP_S
                while not progress.done() and time.monotonic() < caught_up and not await wait_set(stop, 0.2):
                    pass
                reason, ended = f"a trainer finished: {progress.steps_line()}", True
                break
            if time.monotonic() > deadline:
                reason, ended = f"time budget of {run.minutes:g} min spent at {progress.steps_line()}", True
                break
            due = sup.next_due()
            tick = 1.0 if due is None else min(1.0, max(0.05, due - time.monotonic()))
            await wait_set(stop, tick)
            progress.render()
        if ended and evaluated:
            await _final_eval(sup, trainers, finish, evaluator, stop, progress)
    finally:
        stop.set()
        evaluator.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await evaluator
        await progress.stop()
        await control.close()
    return reason


PREPARE_SAY_S = 30.0
"""While a model is built or converted (minutes on a busy machine), `up` says so this often."""


def prepare_models(swarm: Swarm) -> dict[str, Path]:
    """Each model's directory (`resolve_base`), building or converting the missing ones, with a line
    every `PREPARE_SAY_S` seconds meanwhile (a progress bar draws nothing off a terminal)."""
    import threading

    from swarmrl.swarm import resolve_base

    def dirs() -> dict[str, Path]:
        return {name: resolve_base(m) for name, m in swarm.models.items()}

    missing = [
        n for n, m in swarm.models.items() if not (resolve_base(m, build=False) / "config.json").exists()
    ]
    if not missing:
        return dirs()
    names = ", ".join(missing)
    print(f"swarmrl up: preparing model(s) {names} (built or converted once, then cached)", flush=True)
    started, done = time.monotonic(), threading.Event()

    def say() -> None:
        while not done.wait(PREPARE_SAY_S):
            print(f"swarmrl up: still preparing {names}: {time.monotonic() - started:.0f}s", flush=True)

    threading.Thread(target=say, daemon=True).start()
    try:
        found = dirs()
    finally:
        done.set()
    print(f"swarmrl up: model(s) {names} ready in {time.monotonic() - started:.0f}s", flush=True)
    return found


async def _final_eval(
    sup: Supervisor,
    trainers: list[str],
    finish: asyncio.Event,
    evaluator: asyncio.Task[None],
    stop: asyncio.Event,
    progress: Progress,
) -> None:
    """Measure the policy the run ends with: stop the clients (they drain) and the trainers, so the
    machine is the evaluator's and the weights hold still, then let the evaluator take each task's
    newest version. Ctrl-C (`stop`) cuts it short."""
    log.info("final evaluation: stopping clients and trainers, evaluating the newest versions")
    clients = sup.having({"client"})
    await asyncio.to_thread(sup.stop, clients, DRAIN_S + GRACE_S)
    await asyncio.to_thread(sup.stop, list(trainers), 30)
    stopped = {*clients, *trainers}
    finish.set()
    waiter = asyncio.create_task(stop.wait())
    deadline = time.monotonic() + FINAL_EVAL_S
    while not evaluator.done() and not stop.is_set() and time.monotonic() < deadline:
        if crash_loop := sup.heal(lambda name, rc: name in stopped):
            log.error("final evaluation abandoned: %s", crash_loop)
            break
        await asyncio.wait({evaluator, waiter}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        progress.render()
    waiter.cancel()
    if not evaluator.done():
        log.warning("final evaluation not finished; the report shows the last one that did")


def resolved_configs(swarm: Swarm, run_dir: Path) -> dict[str, Any]:
    """What `--print-config` prints: each service process's resolved configuration (ports are picked
    again at the start) and each client's command line; nothing is built or started."""
    from swarmrl.launch import client_argv, client_names, plan_services
    from swarmrl.swarm import resolve_base

    dirs = {name: resolve_base(m, build=False) for name, m in swarm.models.items()}
    out: dict[str, Any] = {p.name: {"service": p.service, "config": config_dict(p.config)}
                           for p in plan_services(swarm, dirs, run_dir)}  # fmt: skip
    for task in swarm.tasks:
        out |= {name: {"argv": client_argv(swarm, task)} for name in client_names(swarm, task)}
    return out


def _watch_nats(sup: Supervisor, server: NatsServer) -> None:
    """Supervise the embedded nats-server like a service: restarted on its own store and port, it
    gets the services back (`bus.connect` reconnects forever)."""

    def start() -> subprocess.Popen[bytes]:
        proc = server.restart().proc
        assert proc is not None
        return proc

    assert server.proc is not None
    sup.adopt("nats", server.proc, start, log=server.log_file, role="nats")


def main(argv: list[str] | None = None) -> int:
    args, swarm = parse_args(argv)
    if args.print_config:
        print(json.dumps(resolved_configs(swarm, args.run_dir or Path("runs/<timestamp>")), indent=2))
        return 0
    from swarmrl.control import default_client_version
    from swarmrl.infra.credentials import AgentRegistry
    from swarmrl.launch import OUTSIDE, AgentIds, plan_services, spawn_clients, spawn_services
    from swarmrl.setup import setup as setup_streams

    setup_logging("up")
    run_dir = rundir.make_run_dir(args.run_dir)
    rundir.write_pid(run_dir)
    (run_dir / SWARM_FILE).write_text(swarm.model_dump_json(indent=2))
    part = {"started": time.time(), "resumed": args.resume is not None}
    model_dirs = prepare_models(swarm)
    server = None
    if args.nats:
        service_url, conf_dir = args.nats, args.nats_conf
        # Role users exist in the SWARM account only: a research run's own account user keeps its URL.
        is_operator = urlsplit(service_url.split(",")[0]).username == OPERATOR
        services_urls = role_urls(service_url) if is_operator else {}
        if not services_urls:
            print("swarmrl up: every service connects as the --nats user (set SWARM_<ROLE>_PASSWORD, as the "
                  "servers have them, for one identity per service role)", flush=True)  # fmt: skip
    else:
        server = NatsServer(store_dir=run_dir / "nats", log_file=run_dir / "logs" / "nats.log").start()
        service_url, conf_dir, services_urls = server.service_url, server.conf_dir, server.role_urls
    rundir.write_service_file(run_dir, service_url)  # for `swarmrl clients/status/down` on this machine
    ids = AgentIds(AgentRegistry(conf_dir), service_url, swarm, run_dir)
    connect_file = ids.mint([OUTSIDE])[OUTSIDE]
    sup = Supervisor(run_dir / "logs", pids_file=run_dir / "pids.json")
    if server is not None:
        _watch_nats(sup, server)
    print(
        f"swarmrl up: run dir {run_dir}  (logs in {run_dir / 'logs'}; stop with Ctrl-C or `swarmrl down`)\n"
        f"swarmrl up: outside agents connect with {connect_file} (models: {', '.join(swarm.models)})",
        flush=True,
    )
    reason = "?"
    try:
        asyncio.run(setup_streams(service_url, ledger_parts=swarm.replicas.ledger > 1, wait_s=30))
        spawn_services(sup, plan_services(swarm, model_dirs, run_dir), run_dir, service_url, services_urls)
        clients = {
            task: spawn_clients(sup, swarm, task, ids, version=default_client_version(swarm, task))
            for task in swarm.tasks
        }
        reason = asyncio.run(
            supervise(swarm, sup, service_url, run_dir, clients, ids, live=not args.no_display)
        )
    finally:
        for roles, timeout in SHUTDOWN:
            sup.stop(sup.having(roles), timeout)
        if server is not None:
            server.stop()
        rundir.clear_pid(run_dir)
        with (run_dir / PARTS_FILE).open("a") as f:
            f.write(json.dumps({**part, "ended": time.time(), "reason": reason}) + "\n")
    from swarmrl.report import write_report

    report = write_report(run_dir, reason=reason)
    print(f"swarmrl up: stopped ({reason}). Report: {report}", flush=True)
    return 0 if "unexpectedly" not in reason else 1  # a crash loop, or every first episode aborted


if __name__ == "__main__":
    sys.exit(main())
