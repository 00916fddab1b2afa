"""The flags that change a swarm description, for `swarmrl up` and a study's arms alike.

A flag overrides one setting (`SETTINGS`: `--lr` is every model's `[models.<m>.trainer] lr`), its
type, choices, default and help read off that setting's declaration, or is one of `up`'s own
(`OWN`). `resolve` applies the flags given to the description they start from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from swarmrl.agents.config import parse_task_weights
from swarmrl.core.config import SwarmConfigError, table_at
from swarmrl.core.rundir import SWARM_FILE
from swarmrl.services.tracker.config import check_installed
from swarmrl.swarm import Swarm, build, check_bases, load

MODEL = "policy"
"""The model name of the short form (flags only, no --config)."""
SETTINGS = {
    **{f: f"run.{f}" for f in ("steps", "minutes", "eval_every", "eval_limit", "eval_samples",
                               "eval_temperature", "max_tokens", "abort_rate", "seed", "actions")},
    "clients": "tasks.*.clients", "concurrency": "tasks.*.concurrency",
    "lr": "models.*.trainer.lr", "num_repeat": "models.*.trainer.num_repeat",
    "batch_groups": "models.*.trainer.batch_groups",
    "micro_batch_tokens": "models.*.trainer.max_tokens_per_micro_batch",
    "max_backlog": "gateway.max_backlog", "track": "tracker.track",
}  # fmt: skip
"""Flag -> the setting of the description it overrides (`*`: every model's, every task's)."""
OWN: dict[str, tuple[type, str]] = {
    "config": (Path, "swarm description (TOML); the flags override it"),
    "task": (str, "task(s) and mixing weights, e.g. calculator (default) or calculator=0.7,guess_number=0.3"),
    "model": (str, "HF model dir or bootstrap preset to train (default: preset `tiny`)"),
    "trainer_arg": (list, "any other trainer setting, as its `swarmrl serve trainer` flag, for every "
                    "model; repeatable (e.g. --trainer-arg=--group-timeout-s=30)"),
}  # fmt: skip
"""`up`'s own flags that shape the description: what each takes (list: repeatable) and its help."""
FLAGS = ["config", "task", "model", *SETTINGS, "trainer_arg"]
"""Every flag that changes the description, in `--help` order."""


def spec(flag: str) -> tuple[type, list[str] | None, str]:
    """What `flag` takes (a type; `list`: repeatable), its choices, and its help."""
    if flag in OWN:
        return OWN[flag][0], None, OWN[flag][1]
    *where, name = SETTINGS[flag].split(".")
    table = table_at(Swarm, where)
    assert table is not None, flag
    info = table.model_fields[name]
    kind: Any = info.annotation
    choices = None
    if get_origin(kind) in (Union, UnionType):  # `int | None`: the flag takes an int
        (kind,) = [a for a in get_args(kind) if a is not type(None)]
    if get_origin(kind) is Literal:
        kind, choices = str, [str(c) for c in get_args(kind)]
    elif get_origin(kind) is list:  # comma-separated; the setting's own validator splits it
        kind = str
    doc = " ".join((info.description or "").split())
    return kind, choices, f"{doc} (default {info.get_default(call_default_factory=True)})"


def add_flags(p: argparse.ArgumentParser) -> None:
    """The description's flags on `up`'s parser; each is None (or []) unless given."""
    for flag in FLAGS:
        kind, choices, help_text = spec(flag)
        name, help_text = f"--{flag.replace('_', '-')}", help_text.replace("%", "%%")
        if kind is list:
            p.add_argument(name, action="append", default=[], metavar="ARG", help=help_text)
        else:
            p.add_argument(name, type=kind, choices=choices, help=help_text)


def resolve(flags: dict[str, Any], resume: Path | None = None) -> Swarm:
    """The swarm `flags` (flag -> value) describe: the run `resume`'s description, else `config`'s
    file, else the short form (one model `policy`), with the flags over it; validated and checked."""
    config = flags.get("config")
    if resume is not None:  # `--task` and `--config` do not go with it (`up.resume_problem`)
        source, data = str(resume / SWARM_FILE), json.loads((resume / SWARM_FILE).read_text())
    elif config is not None:
        source, data = str(config), load(Path(config))
    else:
        weights, source = parse_task_weights(flags.get("task") or "calculator"), "(from flags)"
        data = {"models": {MODEL: {}}, "tasks": {n: {"weight": w} for n, w in weights.items()}}
    if config is not None and "task" in flags:
        weights, tasks = parse_task_weights(flags["task"]), data.get("tasks", {})
        if unknown := sorted(set(weights) - set(tasks)):
            raise SwarmConfigError(f"--task {unknown} not in {source} (tasks: {sorted(tasks)})")
        for name, w in weights.items():
            _put(data, ["tasks", name, "weight"], w, source)
    for key, value in _trainer_args(flags.get("trainer_arg", [])).items():
        _put(data, ["models", "*", "trainer", key], value, source)
    for flag, path in SETTINGS.items():
        if flag in flags:
            _put(data, path.split("."), flags[flag], source)
    if flags.get("model"):
        for key, value in (("base", flags["model"]), ("warm_start", None), ("warm_start_steps", None)):
            _put(data, ["models", "*", key], value, source)
    swarm = build(data, source)
    check_bases(swarm)
    check_installed(swarm.tracker.track)  # the tracker runs here
    if resume is not None:
        check_resumable(swarm, resume)
    return swarm


def _put(table: dict[str, Any], path: list[str], value: Any, source: str, where: str = "") -> None:
    """Set `value` at `path` of the description `table` (`*`: in every entry of that table)."""
    head, *rest = path
    if not rest:
        table[head] = value
        return
    for key in list(table) if head == "*" else [head]:
        sub = table.setdefault(key, {})
        if not isinstance(sub, dict):
            raise SwarmConfigError(f"{source}: [{where}{key}] must be a table, got {sub!r}")
        _put(sub, rest, value, source, f"{where}{key}.")


def _trainer_args(argv: list[str]) -> dict[str, Any]:
    """`--trainer-arg` flags as trainer settings (parsed by the trainer's own command line)."""
    from pydantic_settings import CliSettingsSource

    from swarmrl.services.trainer.config import TrainerConfig

    if not argv:
        return {}
    try:
        return dict(CliSettingsSource(TrainerConfig, cli_parse_args=argv, cli_kebab_case=True,
                                      cli_implicit_flags=True, cli_exit_on_error=False)())  # fmt: skip
    except Exception as exc:  # an unknown flag or a bad value, with the parser's words
        raise SwarmConfigError(f"--trainer-arg {' '.join(argv)}: {exc}") from None


def check_resumable(swarm: Swarm, run_dir: Path) -> None:
    """A resumed run must have steps left: each model's newest checkpoint below `run.steps`."""
    from swarmrl.services.trainer.checkpoint import checkpoint_root, latest

    for model in swarm.models:
        found = latest(checkpoint_root(run_dir, model))
        if found is not None and found[0] >= swarm.run.steps:
            raise SwarmConfigError(
                f"{run_dir} trained {model} to step {found[0]} of its {swarm.run.steps}: "
                f"give --steps above {found[0]} to train on"
            )
