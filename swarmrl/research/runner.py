"""Runs a study: every arm x seed as a `swarmrl up` run, one after another or `--parallel N`.

The loop: reap the runs that ended (metric from their ledger), take the early-stopping decision that
is due, start runs while slots are free and the total budget allows, log progress. Every change is
written to `state.json` first, so `kill -9` at any moment loses at most the runs in flight:
`--resume` keeps a run that had finished and restarts one that had not in a fresh run directory (the
partial one is kept as `<run>.attempt<N>`; `up` cannot continue a run within the same budget).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.core.config import plain_servers
from swarmrl.core.rundir import start_time
from swarmrl.research import processes, schedule
from swarmrl.research.accounts import RunAccounts, wait_usable
from swarmrl.research.flags import arm_swarm, up_argv
from swarmrl.research.ledger import MetricError, metric_value
from swarmrl.research.state import Attempt, RunState, StudyState, save

log = logging.getLogger("swarmrl.research")
POLL_S = 0.25
PROGRESS_S = 30.0


@dataclass
class Runner:
    study_dir: Path
    state: StudyState
    parallel: int = 1
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
            while (c := schedule.due_checkpoint(self.state)) is not None:
                self.decide(c)
                changed = True
            if self._stop:
                return self.interrupt()
            changed |= self.launch()
            if not self.active and not schedule.runnable(self.state):
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
        for run in schedule.runnable(self.state)[: max(0, self.parallel - len(self.active))]:
            if schedule.over_budget(self.state):
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
        args = up_argv(self.state.study, run.arm, run.seed, run_dir)
        argv = [*(self.state.up_command or processes.DEFAULT_UP), *args]
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
        proc = processes.spawn(argv, env, run_dir)
        attempt.pid, attempt.pid_start = proc.pid, start_time(proc.pid)
        self.active[run.id] = proc
        self.save()
        log.info("started %s (attempt %d, pid %d): swarmrl up %s", run.id, n, proc.pid, " ".join(args))

    def reap(self) -> bool:
        changed = False
        for rid, proc in list(self.active.items()):
            if proc.poll() is None:
                continue
            del self.active[rid]
            self.ended(self.state.runs[rid], proc.returncode)
            changed = True
        return changed

    def ended(self, run: RunState, rc: int | None) -> None:
        """Record how a run's `up` ended: a finished run gets its metric, a failed one another try."""
        attempt = run.attempts[-1]
        attempt.ended = time.time()
        reason = processes.up_reason(Path(attempt.run_dir))
        if rc in (0, None) and processes.finished(reason):
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

    def interrupted(self, run: RunState, why: str) -> Attempt:
        """The run's attempt ended by research stopping, not by `up`: it restarts on `--resume`."""
        attempt = run.attempts[-1]
        attempt.ended, attempt.outcome = time.time(), f"interrupted: {why}"
        run.status = "pending"
        self.release(attempt)
        return attempt

    # -- the study -----------------------------------------------------------------------------

    def decide(self, c: int) -> None:
        decision = schedule.decide(self.state, c)
        halved = schedule.apply(self.state, decision)
        self.save()
        ranking = ", ".join(f"{a} {'-' if v is None else f'{v:.4g}'}" for a, v in decision.ranking)
        log.info("early stopping after %d seed(s): ranking %s; kept %s, stopped %s (%d runs not started)",
                 c, ranking, decision.kept, decision.stopped, len(halved))  # fmt: skip

    def skip_rest(self) -> None:
        total = self.state.study.budget.total_minutes
        for run in schedule.remaining(self.state):
            run.status = "skipped"
            run.note = f"total budget of {total:g} min: {self.state.elapsed_s / 60:.1f} min spent"
        log.warning("total budget of %s min reached: the remaining runs are skipped", total)
        self.save()

    def recover(self) -> None:
        """Runs a killed session left `running`: wait for their `up` to stop, keep a finished one,
        restart the others (said plainly)."""
        for run in self.state.runs.values():
            if run.status != "running":
                continue
            attempt = run.attempts[-1]
            run_dir = Path(attempt.run_dir)
            processes.stop_leftover(attempt.pid, attempt.pid_start, run_dir)
            reason = processes.up_reason(run_dir)
            if processes.finished(reason):
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
        for proc in self.active.values():
            proc.send_signal(signal.SIGTERM)
        for rid, proc in self.active.items():
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self.interrupted(self.state.runs[rid], "research was stopped")
        self.active.clear()
        self.save()
        log.warning("stopped; go on with `swarmrl research --resume %s`", self.study_dir)
        return 130

    def build_models(self) -> None:
        from swarmrl.swarm import resolve_base

        study, seen = self.state.study, set()
        for arm in study.arm_names:
            swarm = arm_swarm(study, arm, study.seeds[0])
            for model in swarm.models.values():
                key = (model.base, str(model.warm_start), model.warm_start_steps)
                if key not in seen:
                    seen.add(key)
                    log.info("model %s ready at %s", model.base, resolve_base(model))

    def progress_line(self) -> str:
        counts = self.state.counts()
        finished = sum(counts.get(s, 0) for s in ("done", "failed", "halved", "skipped"))
        running = "; ".join(
            f"{rid}: {processes.progress(Path(self.state.runs[rid].attempts[-1].run_dir))}"
            for rid in self.active
        )
        eta = schedule.eta_s(self.state, self.parallel)
        return (
            f"{finished}/{len(self.state.runs)} runs over ({counts.get('done', 0)} done"
            + "".join(f", {counts[s]} {s}" for s in ("failed", "halved", "skipped") if counts.get(s))
            + f"), {len(self.active)} running{f' ({running})' if running else ''}, "
            f"{len(schedule.remaining(self.state))} to start; {self.state.elapsed_s / 60:.1f} min so far, "
            f"about {eta / 60:.0f} min left"
        )
