"""A study's `swarmrl up` flags: checked against up's own parser, and turned back into its argv.

The baseline and the arms of a study are up flags without the dashes (`lr = 3e-4`, `eval-limit = 8`,
`trainer-arg = [...]`). Each is checked here against `swarmrl.up.build_parser()` (its name, type
and choices), a `config` path is made absolute against the study file's folder, and `up_argv` writes
the exact command line of one run. Flags that research sets per run itself are refused (RESERVED).
"""

from __future__ import annotations

import argparse
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.research.study import Study

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


@cache
def up_parser() -> argparse.ArgumentParser:
    from swarmrl.up import build_parser

    return build_parser()


def up_actions() -> dict[str, argparse.Action]:
    """`swarmrl up`'s flags by name (dest, with underscores) that a study may set."""
    return {a.dest: a for a in up_parser()._actions if a.option_strings and a.dest not in RESERVED}


def _convert(action: argparse.Action, value: FlagValue) -> FlagValue:
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise ValueError(f"is an on/off flag: true or false, got {value!r}")
        return value
    if isinstance(action.default, list):  # append
        items = value if isinstance(value, list) else [value]
        return [str(v) for v in items]
    if isinstance(value, (list, bool)):
        raise ValueError(f"takes one value, got {value!r}")
    try:
        converted = action.type(str(value)) if callable(action.type) else str(value)  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(f"expected {getattr(action.type, '__name__', 'a value')}, got {value!r}") from None
    if isinstance(converted, float) and not math.isfinite(converted):
        raise ValueError(f"must be finite, got {value!r}")
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"must be one of {list(action.choices)}, got {value!r}")
    if isinstance(converted, (bool, int, float, str)):
        return converted
    return str(converted)  # a Path


def normalize_flags(
    flags: dict[str, FlagValue], root: Path, where: str
) -> tuple[dict[str, FlagValue], list[str]]:
    """Flags with `up`'s names and types (a `config` path made absolute against `root`), and errors."""
    actions, out, errors = up_actions(), {}, []
    for key, value in flags.items():
        dest = key.replace("-", "_")
        if dest in RESERVED:
            errors.append(f"{where}.flags.{key}: set by research ({RESERVED[dest]})")
            continue
        if dest not in actions:
            errors.append(
                f"{where}.flags.{key}: unknown swarmrl up flag; known: {', '.join(sorted(a.replace('_', '-') for a in actions))}"
            )
            continue
        try:
            converted = _convert(actions[dest], value)
        except (ValueError, TypeError) as exc:
            errors.append(f"{where}.flags.{key}: {exc}")
            continue
        if dest == "config":
            path = (root / str(converted)).resolve()
            if not path.is_file():
                errors.append(f"{where}.flags.config: {path} does not exist")
            converted = str(path)
        out[dest] = converted
    return out, errors


def arm_namespace(study: Study, arm: str, seed: int) -> argparse.Namespace:
    """The parsed `up` arguments of one run (defaults, then the arm's flags, then the budget)."""
    ns = up_parser().parse_args([])
    ns.nats, ns.nats_conf = "", None
    for dest, value in study.flags(arm).items():
        setattr(ns, dest, Path(str(value)) if dest == "config" else value)
    ns.seed, ns.minutes, ns.steps = seed, study.budget.run_minutes, study.budget.run_steps
    return ns


def up_argv(study: Study, arm: str, seed: int, run_dir: Path) -> list[str]:
    """The `swarmrl up` arguments of one run (what the report prints to reproduce it)."""
    actions, argv = up_actions(), []
    for dest, value in study.flags(arm).items():
        opt = max(actions[dest].option_strings, key=len)
        if isinstance(value, bool):
            argv += [opt] if value else []
        elif isinstance(value, list):
            argv += [f"{opt}={v}" for v in value]
        else:
            argv += [opt, repr(value) if isinstance(value, float) else str(value)]
    argv += ["--minutes", f"{study.budget.run_minutes:g}", "--seed", str(seed)]
    if study.budget.run_steps is not None:
        argv += ["--steps", str(study.budget.run_steps)]
    return [*argv, "--run-dir", str(run_dir), "--no-display"]
