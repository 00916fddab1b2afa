"""The durable state of a study, `<study dir>/state.json`, and what it runs next (pure: no processes).

The state holds what `--resume` and `status` read: the validated study, every run (arm x seed) with
its attempts, the early-stopping decisions, and the running time summed over sessions. It is
rewritten atomically after every change; one process runs a study at a time, holding a lock on
`<study dir>/.lock` that the kernel releases however it dies.

Runs go seed-major: every arm's first seed, then every arm's second, ... Early stopping is successive
halving over seeds: at checkpoint c (`early_stop.after_seeds`) the remaining non-baseline arms are
ranked by mean metric over their first c seeds and the lower part stops (its unstarted runs become
`halved`). No run of a later seed starts before a checkpoint is decided, so every arm is ranked on
the same seeds. Halving saves seeds, not minutes: `swarmrl up` cannot pause a run.
"""

from __future__ import annotations

import fcntl
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel

from swarmrl.core.rundir import write_private
from swarmrl.research.study import Study

STATE = "state.json"
LOCK = ".lock"
RunStatus = Literal["pending", "running", "done", "failed", "halved", "skipped"]
FINISHED: tuple[RunStatus, ...] = ("done", "failed", "halved", "skipped")
STARTUP_S = 90.0
"""Estimate of a run's start and stop (services, evaluation at the end) before any run has finished."""


class Attempt(BaseModel):
    n: int
    run_dir: str
    started: float
    pid: int | None = None
    pid_start: str | None = None  # /proc's start time: a pid the kernel reused is never taken for `up`
    account: str | None = None  # the run's NATS account key, when the study shares NATS servers
    ended: float | None = None
    outcome: str = ""  # `finished: <up's reason>`, `failed: ...` or `interrupted: ...`


class RunState(BaseModel):
    arm: str
    seed: int
    seed_index: int
    status: RunStatus = "pending"
    attempts: list[Attempt] = []
    metric: float | None = None
    note: str = ""  # why it was halved, skipped or failed

    @property
    def id(self) -> str:
        return f"{self.arm}-s{self.seed}"

    @property
    def duration_s(self) -> float | None:
        last = self.attempts[-1] if self.attempts else None
        return None if last is None or last.ended is None else last.ended - last.started


class Decision(BaseModel):
    """An early-stopping checkpoint: the ranking it saw and the arms it stopped. It stands for good."""

    after_seeds: int
    ranking: list[tuple[str, float | None]]
    kept: list[str]
    stopped: list[str]
    at: float


class StudyState(BaseModel):
    version: int = 1
    study: Study
    study_file: str
    created: float
    elapsed_s: float = 0.0  # running time, summed over sessions (what the total budget counts)
    nats: str = ""  # shared NATS servers (no credentials) and their conf dir, when runs share them
    nats_conf: str = ""
    up_command: list[str] = []  # empty: `python -m swarmrl.cli up`
    parallel: int = 1  # runs at once: the last session's `--parallel`
    runs: dict[str, RunState] = {}
    decisions: list[Decision] = []
    finished: float | None = None

    @classmethod
    def new(cls, study: Study, study_file: Path, **kw: Any) -> StudyState:
        state = cls(study=study, study_file=str(study_file), created=time.time(), **kw)
        state._add_runs(study.seeds)
        return state

    def _add_runs(self, seeds: list[int]) -> None:
        for seed in seeds:
            for arm in self.study.arm_names:
                run = RunState(arm=arm, seed=seed, seed_index=self.study.seeds.index(seed))
                if arm in self.stopped_arms:
                    run.status, run.note = "halved", "its arm was stopped before this seed was added"
                self.runs[run.id] = run

    def ordered(self) -> list[RunState]:
        """Runs in the order they start: seed-major, the baseline first."""
        arms = self.study.arm_names
        return sorted(self.runs.values(), key=lambda r: (r.seed_index, arms.index(r.arm)))

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.runs.values()))

    def tally(self) -> str:
        """`4 done, 2 failed of 6 runs, 12.5 min of running time`."""
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts().items()))
        return f"{counts} of {len(self.runs)} runs, {self.elapsed_s / 60:.1f} min of running time"

    # -- what runs next ------------------------------------------------------------------------

    @property
    def stopped_arms(self) -> set[str]:
        return {arm for d in self.decisions for arm in d.stopped}

    def pending_checkpoint(self) -> int | None:
        """The first early-stopping checkpoint not decided yet (None: none left)."""
        if self.study.early_stop is None:
            return None
        decided = {d.after_seeds for d in self.decisions}
        return next((c for c in self.study.early_stop.after_seeds if c not in decided), None)

    def due_checkpoint(self) -> int | None:
        """The checkpoint to decide now: every remaining arm has finished the seeds before it."""
        c, gone = self.pending_checkpoint(), self.stopped_arms
        if c is None:
            return None
        before = [r for r in self.runs.values() if r.seed_index < c and r.arm not in gone]
        return c if all(r.status in FINISHED for r in before) else None

    def decide(self, c: int, now: float | None = None) -> tuple[Decision, list[RunState]]:
        """Rank the remaining non-baseline arms on their first `c` seeds and keep the upper part (an
        arm without any metric ranks last; ties keep the study's arm order). The decision is recorded
        and the stopped arms' runs not yet started become `halved`: (the decision, those runs)."""
        es = self.study.early_stop
        assert es is not None
        gone, order = self.stopped_arms, self.study.arm_names
        sign = -1.0 if self.study.metric.goal == "max" else 1.0
        seen = [(r.arm, r.metric) for r in self.runs.values() if r.seed_index < c and r.metric is not None]
        scores: list[tuple[str, float | None]] = []
        for arm in [a for a in order[1:] if a not in gone]:  # the baseline always goes on
            vals = [m for a, m in seen if a == arm]
            scores.append((arm, sum(vals) / len(vals) if vals else None))
        ranking = sorted(scores, key=lambda s: (s[1] is None, sign * (s[1] or 0.0), order.index(s[0])))
        n_keep = min(len(ranking), max(es.min_arms, math.ceil(es.keep * len(ranking))))
        kept, stopped = [a for a, _ in ranking[:n_keep]], [a for a, _ in ranking[n_keep:]]
        decision = Decision(after_seeds=c, ranking=ranking, kept=kept, stopped=stopped, at=now or time.time())
        self.decisions.append(decision)
        ranks = {arm: i + 1 for i, (arm, _) in enumerate(ranking)}
        halved = [r for r in self.runs.values() if r.arm in stopped and r.status == "pending"]
        for r in halved:
            r.status = "halved"
            r.note = f"arm stopped after {c} seed(s): rank {ranks[r.arm]} of {len(ranks)}, {n_keep} kept"
        return decision, halved

    def add_seeds(self, n: int) -> list[int]:
        """Extend the study by `n` seeds, the next integers above its largest; returns them. Every arm
        early stopping kept gets a pending run per new seed, and a total budget grows in proportion."""
        if n < 1:
            raise ValueError(f"seeds to add must be >= 1, got {n}")
        study, start = self.study, max(self.study.seeds) + 1
        new = list(range(start, start + n))
        if study.budget.total_minutes is not None:
            study.budget.total_minutes *= (len(study.seeds) + n) / len(study.seeds)
        study.seeds = [*study.seeds, *new]
        self._add_runs(new)
        self.finished = None
        return new

    def remaining(self) -> list[RunState]:
        """Runs that may still start (an upper bound: early stopping may drop some)."""
        gone = self.stopped_arms
        return [r for r in self.ordered() if r.status == "pending" and r.arm not in gone]

    def runnable(self) -> list[RunState]:
        """Pending runs that may start now, in order (an undecided checkpoint holds back later seeds)."""
        c = self.pending_checkpoint()
        return [r for r in self.remaining() if c is None or r.seed_index < c]

    def run_estimate_s(self) -> float:
        """Expected wall time of one run: the mean of the finished ones, else the budget plus start-up."""
        done = [r.duration_s for r in self.runs.values() if r.status == "done" and r.duration_s]
        return sum(done) / len(done) if done else self.study.budget.run_minutes * 60 + STARTUP_S

    def eta_s(self, now: float | None = None) -> float:
        """Seconds until every remaining run has finished, packing them on `parallel` slots."""
        now, est = time.time() if now is None else now, self.run_estimate_s()
        slots = [
            max(0.0, est - (now - r.attempts[-1].started))
            for r in self.runs.values()
            if r.status == "running" and r.attempts
        ]
        slots = sorted(slots + [0.0] * max(0, self.parallel - len(slots)))
        for _ in self.remaining():
            slots[0] += est
            slots.sort()
        return max(slots) if slots else 0.0

    def over_budget(self) -> bool:
        """Whether one more run would pass the study's total budget."""
        total = self.study.budget.total_minutes
        return total is not None and self.elapsed_s + self.run_estimate_s() > total * 60


def save(study_dir: Path, state: StudyState) -> None:
    write_private(study_dir / STATE, state.model_dump_json(indent=1), 0o644, fsync=True)


def load(study_dir: Path) -> StudyState:
    path = Path(study_dir) / STATE
    if not path.exists():
        raise FileNotFoundError(f"{study_dir} is no study directory: it has no {STATE}")
    return StudyState.model_validate_json(path.read_text())


def lock(study_dir: Path) -> IO[str]:
    """Hold the study's lock while the returned file stays open (RuntimeError: another process has it)."""
    f = open(Path(study_dir) / LOCK, "a+")  # noqa: SIM115 - held open on purpose
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise RuntimeError(f"study {study_dir} is being run by another process (pid {holder})") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def is_locked(study_dir: Path) -> bool:
    path = Path(study_dir) / LOCK
    if not path.exists():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False
