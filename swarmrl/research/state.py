"""The durable state of a study: `<study dir>/state.json`, rewritten atomically after every change.

It holds what `--resume` and `status` read: the validated study, every run (arm x seed) with its
attempts, the early-stopping decisions, and the running time summed over sessions. One process runs
a study at a time, holding a lock on `<study dir>/.lock` that the kernel releases however it dies.
"""

from __future__ import annotations

import fcntl
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
        return run_id(self.arm, self.seed)

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
    parallel: int = 1  # the last session's `--parallel`
    runs: dict[str, RunState] = {}
    decisions: list[Decision] = []
    finished: float | None = None

    @classmethod
    def new(cls, study: Study, study_file: Path, **kw: Any) -> StudyState:
        runs = {
            run_id(arm, seed): RunState(arm=arm, seed=seed, seed_index=study.seeds.index(seed))
            for arm, seed in study.runs()
        }
        return cls(study=study, study_file=str(study_file), created=time.time(), runs=runs, **kw)

    def ordered(self) -> list[RunState]:
        """Runs in the order they start: seed-major, the baseline first."""
        arms = self.study.arm_names
        return sorted(self.runs.values(), key=lambda r: (r.seed_index, arms.index(r.arm)))

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.runs.values()))


def run_id(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


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
