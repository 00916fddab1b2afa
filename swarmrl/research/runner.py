"""Runs a study: every arm x seed as a `swarmrl up` run, one after another or `--parallel N`.

The loop: reap the runs that ended (metric from their ledger), take the early-stopping decision that
is due, start runs while slots are free and the total budget allows, log progress. Every change is
written to `state.json` first, so `kill -9` at any moment loses at most the runs in flight:
`--resume` keeps a run that had finished and restarts one that had not in a fresh run directory (the
partial one is kept as `<run>.attempt<N>`; `up` cannot continue a run within the same budget).

Each run is `swarmrl up ... --run-dir DIR --no-display` in a session of its own, its output in
`DIR/up.out`, with a parent-death signal (when research dies, even by `kill -9`, every `up` stops as
after Ctrl-C). `up`'s last line, `swarmrl up: stopped (<reason>). Report: <path>`, says why it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.core.config import plain_servers
from swarmrl.core.rundir import pid_file, read_pid, start_time
from swarmrl.research.accounts import RunAccounts, wait_usable
from swarmrl.research.state import Attempt, RunState, StudyState, save
from swarmrl.research.study import MetricError, metric_value
from swarmrl.supervisor import die_with_parent, log_tail, terminate

log = logging.getLogger("swarmrl.research")
POLL_S = 0.25
PROGRESS_S = 30.0
DEFAULT_UP = [sys.executable, "-m", "swarmrl.cli", "up"]
OUT = "up.out"
FINISHED_REASONS = ("a trainer finished", "time budget")
"""The start of `up`'s reason when a run used its budget (steps or minutes) as planned."""
_STOPPED = "swarmrl up: stopped ("
_PROGRESS = re.compile(r"^\[\d+s\] (.*)$", re.M)


def alive(pid: int | None, started: str | None) -> bool:
    """Whether `pid` runs, not a zombie, and (given `started`) is the process that started then."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return pid is not None and len(fields) > 19 and fields[0] != "Z" and started in (None, fields[19])


def up_reason(run_dir: Path) -> str | None:
    """Why the `up` of `run_dir` stopped (its last line), or None if it never said."""
    try:
        text = (run_dir / OUT).read_text(errors="replace")
    except OSError:
        return None
    i = text.rfind(_STOPPED)
    if i < 0:
        return None
    reason, sep, _ = text[i + len(_STOPPED) :].rpartition("). Report: ")
    return reason if sep else None


def finished(reason: str | None) -> bool:
    return reason is not None and reason.startswith(FINISHED_REASONS)


def progress(run_dir: Path) -> str:
    """The run's last progress line from `up --no-display` (step and eval cells), or ""."""
    if not (run_dir / OUT).is_file():
        return ""
    lines = _PROGRESS.findall(log_tail(run_dir / OUT, 1000, 16_384))
    if not lines:
        return "starting"
    cells = lines[-1].split(" | ")
    step = next((c.rsplit(" ", 1)[1] for c in cells if c.startswith("step ") or " step " in c), "?")
    evals = next((c.removeprefix("eval success ") for c in cells if c.startswith("eval success ")), "-")
    return f"step {step}, eval {evals}"


def stop_leftover(pid: int | None, started: str | None, run_dir: Path, wait_s: float = 180.0) -> None:
    """Wait for the `up` of a run whose research process died to stop (the parent-death SIGTERM is
    on its way), then ask (SIGTERM) and finally force it (SIGKILL to its session)."""
    candidates = [(pid, started)]
    with contextlib.suppress(OSError, ValueError, IndexError):  # the pid `up` recorded in its run dir
        candidates.append(read_pid(pid_file(run_dir)))
    live = [(p, s) for p, s in candidates if p is not None and alive(p, s)]
    if not live:
        return
    log.info("waiting for the leftover swarmrl up of %s (pid %s) to stop", run_dir.name, live[0][0])
    deadline = time.monotonic() + wait_s
    for sig, until in ((None, deadline - 30), (signal.SIGTERM, deadline), (signal.SIGKILL, deadline + 10)):
        for p, s in live:
            if sig is not None and alive(p, s):
                log.warning("sending %s to the leftover swarmrl up (pid %d) of %s", sig.name, p, run_dir.name)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p, sig) if sig == signal.SIGKILL else os.kill(p, sig)
        while time.monotonic() < until and any(alive(p, s) for p, s in live):
            time.sleep(0.5)
        if not any(alive(p, s) for p, s in live):
            return


@dataclass
class Runner:
    study_dir: Path
    state: StudyState
    prepare_models: bool = True
    """Build each arm's preset models once before the first run (parallel `up`s would race to)."""
    active: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _stop: bool = False

    @property
    def accounts(self) -> RunAccounts | None:
        return RunAccounts(Path(self.state.nats_conf)) if self.state.nats else None

    def save(self) -> None:
        save(self.study_dir, self.state)

    def run(self) -> int:
        """Run the study to its end; 0 if every run finished, 1 if some failed, 130 if stopped."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: setattr(self, "_stop", True))
        self.recover()
        if self.prepare_models:
            self.build_models()
        last, last_line = time.monotonic(), 0.0
        while True:
            now = time.monotonic()
            self.state.elapsed_s += now - last
            last = now
            changed = self.reap()
            while (c := self.state.due_checkpoint()) is not None:
                self.decide(c)
                changed = True
            if self._stop:
                return self.interrupt()
            changed |= self.launch()
            if not self.active and not self.state.runnable():
                break
            if changed or now - last_line > PROGRESS_S:
                self.save()
                log.info("%s", self.progress_line())
                last_line = now
            time.sleep(POLL_S)
        self.state.finished = time.time()
        self.save()
        log.info("study finished: %s", self.progress_line())
        return 1 if any(r.status == "failed" for r in self.state.runs.values()) else 0

    # -- one run -------------------------------------------------------------------------------

    def launch(self) -> bool:
        started = False
        for run in self.state.runnable()[: max(0, self.state.parallel - len(self.active))]:
            if self.state.over_budget():
                if not self.active:
                    self.skip_rest()
                return started
            self.start(run)
            started = True
        return started

    def start(self, run: RunState) -> None:
        n = len(run.attempts) + 1
        run_dir = self.study_dir / "runs" / run.id
        if run_dir.exists():  # an earlier attempt's: kept beside, for the record
            kept = run_dir.with_name(f"{run.id}.attempt{n - 1}")
            run_dir.rename(kept)
            if run.attempts:
                run.attempts[-1].run_dir = str(kept)
        args = self.state.study.up_argv(run.arm, run.seed, run_dir)
        argv = [*(self.state.up_command or DEFAULT_UP), *args]
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        attempt = Attempt(n=n, run_dir=str(run_dir), started=time.time())
        if (accounts := self.accounts) is not None:
            attempt.account = f"{self.state.study.name}-{run.id}-a{n}"
            acct = accounts.create(attempt.account)
            env["SWARMRL_NATS"] = acct.url(plain_servers(self.state.nats))
            asyncio.run(wait_usable(env["SWARMRL_NATS"]))
            argv += ["--nats-conf", str(acct.conf_dir)]
        run.status, run.note = "running", ""
        run.attempts.append(attempt)
        self.save()  # before the process exists: a kill now leaves a run to restart, never a stray one
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / OUT, "ab") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        attempt.pid, attempt.pid_start = proc.pid, start_time(proc.pid)
        self.active[run.id] = proc
        self.save()
        log.info("started %s (attempt %d, pid %d): swarmrl up %s", run.id, n, proc.pid, " ".join(args))

    def reap(self) -> bool:
        ended = [(rid, proc) for rid, proc in self.active.items() if proc.poll() is not None]
        for rid, proc in ended:
            del self.active[rid]
            self.ended(self.state.runs[rid], proc.returncode)
        return bool(ended)

    def ended(self, run: RunState, rc: int | None) -> None:
        """Record how a run's `up` ended: a finished run gets its metric, a failed one another try."""
        attempt = run.attempts[-1]
        attempt.ended = time.time()
        reason = up_reason(Path(attempt.run_dir))
        if rc in (0, None) and finished(reason):
            attempt.outcome = f"finished: {reason}"
            run.status = "done"
            try:
                run.metric = metric_value(Path(attempt.run_dir), self.state.study.metric.query)
            except MetricError as exc:
                run.note = f"metric: {exc}"
            if run.metric is None:
                run.note = run.note or "the metric SQL gave no value (NULL or no row) on this run's ledger"
            log.info("%s finished (%s); %s = %s", run.id, reason, self.state.study.metric.label, run.metric)
        else:
            attempt.outcome = f"failed: exit {rc}, {(reason or 'no reason printed').splitlines()[0]}"
            failures = sum(a.outcome.startswith("failed") for a in run.attempts)
            retry = failures < self.state.study.budget.attempts
            run.status = "pending" if retry else "failed"
            run.note = "" if retry else attempt.outcome
            log.warning("%s %s (see %s/up.out); %s", run.id, attempt.outcome, attempt.run_dir,
                        "it will be tried again" if retry else "giving up on it")  # fmt: skip
        self.release(attempt)
        self.save()

    def release(self, attempt: Attempt) -> None:
        if attempt.account and (accounts := self.accounts) is not None:
            accounts.remove(attempt.account, plain_servers(self.state.nats))

    def interrupted(self, run: RunState, why: str) -> None:
        """The run's attempt ended by research stopping, not by `up`: it restarts on `--resume`."""
        attempt = run.attempts[-1]
        attempt.ended, attempt.outcome = time.time(), f"interrupted: {why}"
        run.status = "pending"
        self.release(attempt)

    # -- the study -----------------------------------------------------------------------------

    def decide(self, c: int) -> None:
        decision, halved = self.state.decide(c)
        self.save()
        ranking = ", ".join(f"{a} {'-' if v is None else f'{v:.4g}'}" for a, v in decision.ranking)
        log.info("early stopping after %d seed(s): ranking %s; kept %s, stopped %s (%d runs not started)",
                 c, ranking, decision.kept, decision.stopped, len(halved))  # fmt: skip

    def skip_rest(self) -> None:
        total = self.state.study.budget.total_minutes
        for run in self.state.remaining():
            run.status = "skipped"
            run.note = f"total budget of {total:g} min: {self.state.elapsed_s / 60:.1f} min spent"
        log.warning("total budget of %s min reached: the remaining runs are skipped", total)
        self.save()

    def recover(self) -> None:
        """Runs a killed session left `running`: wait for their `up` to stop, keep a finished one,
        restart the others (said plainly)."""
        for run in [r for r in self.state.runs.values() if r.status == "running"]:
            attempt = run.attempts[-1]
            run_dir = Path(attempt.run_dir)
            stop_leftover(attempt.pid, attempt.pid_start, run_dir)
            reason = up_reason(run_dir)
            if finished(reason):
                log.info("%s had finished while research was down: kept", run.id)
                self.ended(run, None)
                continue
            self.interrupted(run, f"research stopped while it ran ({reason or 'up said nothing'})")
            log.warning("%s was interrupted (attempt %d, %.1f min in); it restarts from the beginning in a fresh "
                        "run dir (%s.attempt%d keeps the partial run): up cannot continue a run within its budget",
                        run.id, attempt.n, (time.time() - attempt.started) / 60, run_dir, attempt.n)  # fmt: skip
            self.save()

    def interrupt(self) -> int:
        """Ctrl-C / SIGTERM: stop the runs in flight (they restart on `--resume`) and save."""
        log.warning(
            "stopping: %d run(s) in flight are interrupted (they restart on --resume)", len(self.active)
        )
        terminate(self.active, timeout=180)
        for rid in self.active:
            self.interrupted(self.state.runs[rid], "research was stopped")
        self.active.clear()
        self.save()
        log.warning("stopped; go on with `swarmrl research --resume %s`", self.study_dir)
        return 130

    def build_models(self) -> None:
        from swarmrl.swarm import resolve_base

        study, seen = self.state.study, set()
        for arm in study.arm_names:
            for model in study.swarm(arm, study.seeds[0]).models.values():
                key = (model.base, str(model.warm_start), model.warm_start_steps)
                if key not in seen:
                    seen.add(key)
                    log.info("model %s ready at %s", model.base, resolve_base(model))

    def progress_line(self) -> str:
        running = "; ".join(
            f"{rid}: {progress(Path(self.state.runs[rid].attempts[-1].run_dir))}" for rid in self.active
        )
        return (
            f"{self.state.tally()}; {len(self.active)} running{f' ({running})' if running else ''}, "
            f"{len(self.state.remaining())} to start, about {self.state.eta_s() / 60:.0f} min left"
        )
