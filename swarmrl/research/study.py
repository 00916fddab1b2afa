"""The study file: the question, a baseline swarm, arms that change it, seeds, metric and budget.

A study is a TOML file (`swarmrl research --template` prints a commented one). The baseline and every
arm are `swarmrl up` flags without the dashes; an arm's flags replace the baseline's of the same
name. `load_study` validates everything before a single run starts (the schema, every flag, every
arm's swarm, the metric SQL on an empty ledger), each error naming its entry.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from swarmrl.core.config import Strict, error_lines
from swarmrl.research.flags import FlagValue, arm_swarm, normalize_flags
from swarmrl.research.ledger import check_sql

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$"
_PER_STEP = "SELECT step, avg(success_rate) AS y FROM evals WHERE coalesce(metric, 'success') = 'success' GROUP BY step"
PRESETS: dict[str, tuple[str, str]] = {
    "final_success": (
        "held-out success at the last evaluated version (mean over tasks)",
        f"WITH c AS ({_PER_STEP}) SELECT y FROM c ORDER BY step DESC LIMIT 1",
    ),
    "best_success": ("best held-out success of any version", f"WITH c AS ({_PER_STEP}) SELECT max(y) FROM c"),
    "auc_success": (
        "area under the held-out success curve over versions, divided by its span (its mean height)",
        f"WITH c AS ({_PER_STEP}), d AS (SELECT step, y, lag(step) OVER w AS s0, lag(y) OVER w AS y0 FROM c "
        "WINDOW w AS (ORDER BY step)) SELECT coalesce(sum((step - s0) * (y + y0) / 2) / "
        "nullif(max(step) - min(step), 0), max(y)) FROM d",
    ),
    "final_reward": (
        "mean training reward of the last 10 trainer steps",
        "SELECT avg(reward_mean) FROM (SELECT reward_mean FROM train_steps ORDER BY step DESC LIMIT 10)",
    ),
}
"""Named metrics: name -> (what it measures, SQL over one run's ledger)."""
DEFAULT_CURVE = f"{_PER_STEP} ORDER BY step"


class StudyError(ValueError):
    """The study is invalid; the message lists every bad entry."""


class Arm(Strict):
    flags: dict[str, FlagValue] = {}
    """`swarmrl up` flags of this arm (replacing the baseline's of the same name)."""
    note: str = ""
    """Why this arm is in the study (shown in the report)."""


class Baseline(Arm):
    name: str = Field(default="baseline", pattern=NAME_PATTERN)
    """Name of the baseline's own arm (the reference every other arm is compared with)."""


class Metric(Strict):
    use: str | None = None
    """A named metric (see PRESETS: final_success, best_success, auc_success, final_reward)."""
    sql: str | None = None
    """Or your own: one SELECT over a run's ledger views, one row, one numeric column."""
    curve: str = DEFAULT_CURVE
    """SELECT of a run's (x, y) curve for the plots (default: held-out success per version)."""
    name: str = ""
    """Label in the report (default: the preset's name, else `metric`)."""
    goal: Literal["max", "min"] = "max"
    """Whether higher (max) or lower (min) is better: orders arms for early stopping and findings."""

    @model_validator(mode="after")
    def _check(self) -> Metric:
        if (self.use is None) == (self.sql is None):
            raise ValueError(f"give exactly one of `use` (one of {sorted(PRESETS)}) or `sql`")
        if self.use is not None and self.use not in PRESETS:
            raise ValueError(f"use: unknown metric {self.use!r}; known: {sorted(PRESETS)}")
        return self

    @property
    def query(self) -> str:
        """The SQL of one run's value: `sql`, or the named metric's."""
        return self.sql if self.sql is not None else PRESETS[self.use or ""][1]

    @property
    def label(self) -> str:
        return self.name or self.use or "metric"


class Budget(Strict):
    run_minutes: float = Field(gt=0)
    """Wall-clock budget of each run (`up --minutes`)."""
    run_steps: int | None = Field(default=None, ge=1)
    """Trainer steps of each run (`up --steps`); a run ends at whichever comes first. None: up's default."""
    total_minutes: float | None = Field(default=None, gt=0)
    """Cap on the whole study's running time (summed over resumes); runs that would pass it are skipped."""
    attempts: int = Field(default=2, ge=1)
    """Tries per run when `up` fails (a crash loop); interruptions (kill, Ctrl-C) do not count."""


class EarlyStop(Strict):
    """Successive halving over seeds: at each checkpoint the arms ranked in the lower part stop."""

    after_seeds: list[int] = Field(min_length=1)
    """Checkpoints: once every remaining arm has finished this many seeds, rank them by mean metric."""
    keep: float = Field(default=0.5, gt=0, lt=1)
    """Share of the non-baseline arms kept at a checkpoint (rounded up); the baseline always goes on."""
    min_arms: int = Field(default=1, ge=1)
    """Fewest non-baseline arms kept at a checkpoint."""


class Study(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    """Short name (directory names)."""
    question: str = Field(min_length=1)
    """What the study asks, in a sentence."""
    seeds: list[int] = Field(min_length=1)
    """Seeds of every arm (`up --seed`); every arm runs once per seed."""
    baseline: Baseline = Baseline()
    arms: dict[str, Arm] = {}
    """Arm name -> its changes to the baseline."""
    metric: Metric = Metric(use="final_success")
    budget: Budget
    early_stop: EarlyStop | None = None

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or min(v) < 0:
            raise ValueError(f"seeds must be distinct and >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _check(self) -> Study:
        for arm in self.arms:
            if not re.match(NAME_PATTERN, arm) or arm == self.baseline.name:
                raise ValueError(f"arms.{arm}: an arm name is 1-40 of [A-Za-z0-9_.-], not the baseline's")
        if self.early_stop is not None:
            cps = self.early_stop.after_seeds
            if cps != sorted(set(cps)) or not all(0 < c < len(self.seeds) for c in cps):
                raise ValueError(
                    f"early_stop.after_seeds {cps}: increasing checkpoints between 1 and {len(self.seeds) - 1}"
                )
        total = self.budget.total_minutes
        if total is not None and total < self.budget.run_minutes:
            raise ValueError(
                f"budget.total_minutes {total:g} is less than one run ({self.budget.run_minutes:g})"
            )
        return self

    @property
    def arm_names(self) -> list[str]:
        return [self.baseline.name, *self.arms]

    def flags(self, arm: str) -> dict[str, FlagValue]:
        """The `up` flags of `arm`: the baseline's, replaced by the arm's own."""
        return (
            self.baseline.flags if arm == self.baseline.name else self.baseline.flags | self.arms[arm].flags
        )

    def runs(self) -> list[tuple[str, int]]:
        """(arm, seed) of every run, seed-major (all arms' first seed first: what early stopping needs)."""
        return [(arm, seed) for seed in self.seeds for arm in self.arm_names]


def parse_study(data: dict[str, Any], root: Path, source: str = "study") -> Study:
    """Validate a parsed study; `root` resolves paths in flags. A StudyError lists every problem found."""
    from swarmrl.swarm import SwarmConfigError

    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        raise StudyError(f"invalid study {source}:\n  " + "\n  ".join(error_lines(exc, Study))) from None
    errors = []
    for where, own in [("baseline", study.baseline), *((f"arms.{n}", a) for n, a in study.arms.items())]:
        own.flags, errs = normalize_flags(own.flags, root, where)
        errors += errs
    if not errors:
        seen = set()  # an error of the baseline's is every arm's too: named once
        for arm in study.arm_names:
            where = "baseline" if arm == study.baseline.name else f"arms.{arm}"
            try:
                arm_swarm(study, arm, study.seeds[0])
            except SwarmConfigError as exc:
                if str(exc) not in seen:
                    errors.append(f"{where}: " + str(exc).replace("\n", "\n    "))
                seen.add(str(exc))
    for field, sql, cols in (("sql", study.metric.query, 1), ("curve", study.metric.curve, 2)):
        if reason := check_sql(sql, cols):
            errors.append(f"metric.{field}: {reason}")
    if errors:
        raise StudyError(f"invalid study {source}:\n  " + "\n  ".join(errors))
    return study


def load_study_text(text: str, root: Path, source: str = "study") -> Study:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"invalid study {source}: not valid TOML: {exc}") from None
    return parse_study(data, root, source)


def load_study(path: Path) -> Study:
    """Read and validate a study file (relative paths in it are relative to its folder)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise StudyError(f"cannot read study {path}: {exc}") from None
    return load_study_text(text, Path(path).resolve().parent, str(path))
