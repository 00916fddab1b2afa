"""A study's `swarmrl up` flags: checked against the flags that change a swarm description, resolved
into each arm's swarm, and written as the command line of each run.

A study's flags are those of `swarmrl.overrides.FLAGS` without the dashes, each checked by the type
and choices of the setting it overrides; a `config` path is made absolute against the study file's
folder. Flags that research sets per run itself are refused (RESERVED).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.overrides import FLAGS, resolve, spec

if TYPE_CHECKING:
    from swarmrl.research.study import Study
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


def _convert(flag: str, value: FlagValue) -> FlagValue:
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
    return converted if isinstance(converted, (int, float, str)) else str(converted)  # a Path


def normalize_flags(
    flags: dict[str, FlagValue], root: Path, where: str
) -> tuple[dict[str, FlagValue], list[str]]:
    """Flags with `up`'s names and types (a `config` path made absolute against `root`), and errors."""
    out, errors = {}, []
    for key, value in flags.items():
        flag = key.replace("-", "_")
        if flag in RESERVED:
            errors.append(f"{where}.flags.{key}: set by research ({RESERVED[flag]})")
            continue
        if flag not in KNOBS:
            near = difflib.get_close_matches(flag, KNOBS, n=1)
            hint = f"did you mean {near[0].replace('_', '-')}? " if near else ""
            known = ", ".join(sorted(f.replace("_", "-") for f in KNOBS))
            errors.append(f"{where}.flags.{key}: unknown swarmrl up flag; {hint}known: {known}")
            continue
        try:
            converted = _convert(flag, value)
        except (ValueError, TypeError) as exc:
            errors.append(f"{where}.flags.{key}: {exc}")
            continue
        if flag == "config":
            path = (root / str(converted)).resolve()
            if not path.is_file():
                errors.append(f"{where}.flags.config: {path} does not exist")
            converted = str(path)
        out[flag] = converted
    return out, errors


def arm_swarm(study: Study, arm: str, seed: int) -> Swarm:
    """The swarm one run of `arm` trains, resolved as `swarmrl up` resolves its own flags."""
    steps = {"steps": study.budget.run_steps} if study.budget.run_steps is not None else {}
    return resolve(study.flags(arm) | {"minutes": study.budget.run_minutes, "seed": seed} | steps)


def up_argv(study: Study, arm: str, seed: int, run_dir: Path) -> list[str]:
    """The `swarmrl up` arguments of one run (what the report prints to reproduce it)."""
    argv: list[str] = []
    for flag, value in study.flags(arm).items():
        opt = f"--{flag.replace('_', '-')}"
        if isinstance(value, list):
            argv += [f"{opt}={v}" for v in value]
        else:
            argv += [opt, repr(value) if isinstance(value, float) else str(value)]
    argv += ["--minutes", f"{study.budget.run_minutes:g}", "--seed", str(seed)]
    if study.budget.run_steps is not None:
        argv += ["--steps", str(study.budget.run_steps)]
    return [*argv, "--run-dir", str(run_dir), "--no-display"]
