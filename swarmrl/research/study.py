"""The study file: the question, a baseline swarm, arms that change it, seeds, metric and budget.

A study is a TOML file (`swarmrl research --template` prints a commented one). The baseline and every
arm are `swarmrl up` flags without the dashes (those of `swarmrl.overrides.FLAGS`, each checked by
the type and choices of the setting it overrides; a `config` path is made absolute against the study
file's folder; flags research sets per run itself are refused: RESERVED); an arm's flags replace the
baseline's of the same name. `load_study` validates everything before a single run starts (the
schema, every flag, every arm's swarm, the metric SQL on an empty ledger), each error naming its entry.

The metric SQL may be written by an LLM (`--topic`), so it runs in a DuckDB that can reach no file:
the ledger views it names (those of `swarmrl query`) are first read into memory, then handed to a
connection opened with `enable_external_access = false`. One SELECT statement only.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import tempfile
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import duckdb
from pydantic import Field, ValidationError, field_validator, model_validator

from swarmrl.core.config import Strict, error_lines
from swarmrl.overrides import FLAGS, resolve, spec
from swarmrl.services.ledger.views import VIEWS, register_views

if TYPE_CHECKING:
    from swarmrl.swarm import Swarm

FlagValue = bool | int | float | str | list[str]
RESERVED = {
    "seed": "the seed comes from `seeds`",
    "minutes": "the budget per run is [budget].run_minutes",
    "steps": "the budget per run is [budget].run_steps",
    "run_dir": "each run gets its own directory in the study directory",
    "nats": "give `swarmrl research --nats URL --nats-conf DIR` to share servers",
    "nats_conf": "give `swarmrl research --nats URL --nats-conf DIR` to share servers",
    "no_display": "research runs `up` with plain log lines",
    "help": "not a knob",
}
"""`swarmrl up` flags a study may not set, and why."""
KNOBS = [f for f in FLAGS if f not in RESERVED]
"""The flags a study may set."""


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

    def swarm(self, arm: str, seed: int) -> Swarm:
        """The swarm one run of `arm` trains, resolved as `swarmrl up` resolves its own flags."""
        steps = {"steps": self.budget.run_steps} if self.budget.run_steps is not None else {}
        return resolve(self.flags(arm) | {"minutes": self.budget.run_minutes, "seed": seed} | steps)

    def up_argv(self, arm: str, seed: int, run_dir: Path) -> list[str]:
        """The `swarmrl up` arguments of one run (what the report prints to reproduce it)."""
        argv: list[str] = []
        for flag, value in self.flags(arm).items():
            opt = f"--{flag.replace('_', '-')}"
            if isinstance(value, list):
                argv += [f"{opt}={v}" for v in value]
            else:
                argv += [opt, repr(value) if isinstance(value, float) else str(value)]
        argv += ["--minutes", f"{self.budget.run_minutes:g}", "--seed", str(seed)]
        if self.budget.run_steps is not None:
            argv += ["--steps", str(self.budget.run_steps)]
        return [*argv, "--run-dir", str(run_dir), "--no-display"]


def _flag(flag: str, value: FlagValue, root: Path) -> FlagValue:
    """The value of `up`'s flag `flag` in its type (a `config` path made absolute against `root`)."""
    if flag in RESERVED:
        raise ValueError(f"set by research ({RESERVED[flag]})")
    if flag not in KNOBS:
        near = difflib.get_close_matches(flag, KNOBS, n=1)
        hint = f"did you mean {near[0].replace('_', '-')}? " if near else ""
        known = ", ".join(sorted(f.replace("_", "-") for f in KNOBS))
        raise ValueError(f"unknown swarmrl up flag; {hint}known: {known}")
    kind, choices, _ = spec(flag)
    if kind is list:  # repeatable
        return [str(v) for v in (value if isinstance(value, list) else [value])]
    if isinstance(value, (list, bool)):
        raise ValueError(f"takes one value, got {value!r}")
    try:
        converted = kind(str(value))
    except (TypeError, ValueError):
        raise ValueError(f"expected {kind.__name__}, got {value!r}") from None
    if isinstance(converted, float) and not math.isfinite(converted):
        raise ValueError(f"must be finite, got {value!r}")
    if choices is not None and converted not in choices:
        raise ValueError(f"must be one of {choices}, got {value!r}")
    if flag == "config":
        path = (root / str(converted)).resolve()
        if not path.is_file():
            raise ValueError(f"{path} does not exist")
        return str(path)
    return converted if isinstance(converted, (int, float, str)) else str(converted)  # a Path


def load_study_text(text: str, root: Path, source: str = "study") -> Study:
    """Parse and validate a study; `root` resolves paths in flags. A StudyError lists every problem found."""
    from swarmrl.swarm import SwarmConfigError

    try:
        study = Study.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"invalid study {source}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        raise StudyError(f"invalid study {source}:\n  " + "\n  ".join(error_lines(exc, Study))) from None
    errors = []
    for where, own in [("baseline", study.baseline), *((f"arms.{n}", a) for n, a in study.arms.items())]:
        flags = {}
        for key, value in own.flags.items():
            flag = key.replace("-", "_")
            try:
                flags[flag] = _flag(flag, value, root)
            except (ValueError, TypeError) as exc:
                errors.append(f"{where}.flags.{key}: {exc}")
        own.flags = flags
    if not errors:
        seen = set()  # an error of the baseline's is every arm's too: named once
        for arm in study.arm_names:
            where = "baseline" if arm == study.baseline.name else f"arms.{arm}"
            try:
                study.swarm(arm, study.seeds[0])
            except SwarmConfigError as exc:
                if str(exc) not in seen:
                    errors.append(f"{where}: " + str(exc).replace("\n", "\n    "))
                seen.add(str(exc))
    for field, sql, cols in (("sql", study.metric.query, 1), ("curve", study.metric.curve, 2)):
        try:
            names = list(sql_columns(sql))
        except MetricError as exc:
            errors.append(f"metric.{field}: {exc}")
            continue
        if len(names) != cols:
            errors.append(f"metric.{field}: must select {cols} column(s), selects {len(names)}: {names}")
    if errors:
        raise StudyError(f"invalid study {source}:\n  " + "\n  ".join(errors))
    return study


def load_study(path: Path) -> Study:
    """Read and validate a study file (relative paths in it are relative to its folder)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise StudyError(f"cannot read study {path}: {exc}") from None
    return load_study_text(text, Path(path).resolve().parent, str(path))


class MetricError(ValueError):
    """The metric (or curve) SQL cannot be run, or gives something that is not a number."""


def referenced_views(sql: str) -> list[str]:
    """The ledger views `sql` mentions (a word match; a miss only means an unknown-table error)."""
    return [v for v in VIEWS if re.search(rf"\b{v}\b", sql, flags=re.IGNORECASE)]


def run_sql(run_dir: Path | None, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows) of `sql` over the ledger of `run_dir` (None: an empty ledger, where every
    view exists with its columns and no rows). MetricError: not one SELECT, or DuckDB refused it."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise MetricError(str(exc).splitlines()[0]) from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise MetricError(f"must be one SELECT statement, got {len(statements)} statement(s)")
    with tempfile.TemporaryDirectory() as empty:
        source = duckdb.connect()
        register_views(source, run_dir if run_dir is not None else Path(empty))
        tables = {v: source.sql(f"SELECT * FROM {v}").to_arrow_table() for v in referenced_views(sql)}
        source.close()
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        for name, table in tables.items():
            con.register(name, table)
        result = con.execute(sql)
        columns = [d[0] for d in result.description or []]
        return columns, result.fetchall()
    except duckdb.Error as exc:
        raise MetricError(str(exc).splitlines()[0]) from None
    finally:
        con.close()


@functools.lru_cache(maxsize=64)  # the named metrics are checked for every study loaded
def sql_columns(sql: str) -> tuple[str, ...]:
    """The column names `sql` selects, from a run over an empty ledger."""
    return tuple(run_sql(None, sql)[0])


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise MetricError(f"{what} is not a number: {value!r}") from None


def metric_value(run_dir: Path, sql: str) -> float | None:
    """The metric of one run: the first column of the first row (None: no row, or NULL)."""
    _, rows = run_sql(run_dir, sql)
    return _number(rows[0][0], "the metric") if rows else None


def curve(run_dir: Path, sql: str) -> list[tuple[float, float]]:
    """The (x, y) points of one run's curve, rows with a NULL dropped."""
    points = [(_number(x, "a curve x"), _number(y, "a curve y")) for x, y, *_ in run_sql(run_dir, sql)[1]]
    return [(x, y) for x, y in points if x is not None and y is not None]


# The commented study template (`swarmrl research --template`), also shown to the planner LLM.

TEMPLATE = """\
# A swarmrl study: `swarmrl research THIS.toml`. Paths are relative to this file.
name = "my-study"                        # 1-40 of [A-Za-z0-9_.-]: names the study directory
question = "Does a higher learning rate make calculator learn faster?"
seeds = [1, 2, 3]                        # every arm runs once per seed (`swarmrl up --seed`)

[baseline]                               # the reference swarm; it runs as the first arm
name = "baseline"
note = "up's defaults"
# `swarmrl up` flags without the dashes (`swarmrl up --help`): config, task, model, clients,
# concurrency, num-repeat, batch-groups, lr, micro-batch-tokens, max-backlog, eval-every,
# eval-limit, eval-samples, eval-temperature, max-tokens, abort-rate, actions, trainer-arg.
# Set by research, never here: seed, minutes, steps, run-dir, nats, nats-conf, no-display.
flags = { task = "calculator", eval-limit = 32 }
# flags = { config = "../examples/cocktail.toml" }   # a swarm description instead of the short form

[arms.high-lr]                           # an arm: the baseline with these flags replaced
flags = { lr = 3e-4 }
note = "three times the default"

[arms.kl]
flags = { trainer-arg = ["--kl-coef=0.01"] }   # extra trainer flags (`swarmrl serve trainer --help`)

[metric]                                 # one number per run, from its ledger (DuckDB)
use = "final_success"                    # final_success | best_success | auc_success | final_reward
# or your own SELECT over the run's ledger views (evals, train_steps, episodes, ...; see
# `swarmrl query --help`): one row, one numeric column
# sql = "SELECT avg(success_rate) FROM evals WHERE step >= 20"
# curve = "SELECT step, avg(success_rate) FROM evals GROUP BY step ORDER BY step"   # plotted (x, y)
goal = "max"                             # max: higher is better; min: lower is better

[budget]
run_minutes = 10                         # wall clock per run (`up --minutes`)
# run_steps = 100                        # and/or trainer steps per run (`up --steps`)
total_minutes = 120                      # the whole study; runs that would pass it are skipped
attempts = 2                             # tries per run when up fails (interruptions do not count)

# Successive halving over seeds (optional): once every remaining arm has finished the first
# `after_seeds` seeds, the lower-ranked arms stop getting seeds; the baseline always goes on.
[early_stop]
after_seeds = [1]
keep = 0.5                               # share of the non-baseline arms kept (rounded up)
min_arms = 1
"""
