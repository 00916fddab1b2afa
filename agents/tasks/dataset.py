"""Dataset tasks: rows of prompts and a reward function of the user's own, played like a built-in task.

A `[tasks.<name>]` table with `data = [...]` becomes a `TaskSpec` here, registered in every process
that plays it (`swarmrl up`, and each client from `$SWARMRL_TASKS_FILE`).

- Rows come from local files through `datasets`, never from a hub; a bad prompt is an error naming
  the row, at load.
- An instance is one row (`DataRow`) with a stable `task_id` (`<task>-<row>`, `<task>-eval<row>`).
- An episode is one model call, then the reward, called TRL's way once per group (`rewards.py`);
  it is probed once at start, so a result of the wrong shape stops the run before any episode.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import json
import logging
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmrl.agents.config import TaskConf
from swarmrl.agents.tasks.base import Message, StepResult, TaskSpec, message_text
from swarmrl.agents.tasks.rewards import RewardError, Scorer

__all__ = ["DataEnv", "DataRow", "DataTask", "DatasetError", "RewardError", "data_task"]

log = logging.getLogger("swarmrl.agents.dataset")
PROBE = ["1", "0"]  # the start-up probe's completions (the first: the row's answer, if any)

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
EVAL_SPLITS = ("test", "validation")


class DatasetError(ValueError):
    """A dataset task cannot be built: the message names the task, the file or row, and the fix."""


@dataclass(frozen=True)
class DataRow:
    task_id: str
    columns: Mapping[str, Any]


def _load_files(name: str, paths: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Rows of `paths` by split: `{"train": rows}` for files, every split of a saved `DatasetDict`."""
    import datasets

    datasets.disable_progress_bars()
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise DatasetError(f"task {name}: no such data file or directory: {missing}")
    if len(paths) == 1 and Path(paths[0]).is_dir():
        try:
            loaded = datasets.load_from_disk(paths[0])
        except FileNotFoundError as exc:
            raise DatasetError(
                f"task {name}: {paths[0]} is not a dataset saved with save_to_disk ({exc})"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            return {split: ds.to_list() for split, ds in loaded.items()}
        return {"train": loaded.to_list()}
    kinds = {FORMATS.get(Path(p).suffix.lower()) for p in paths}
    if None in kinds or len(kinds) != 1:
        raise DatasetError(
            f"task {name}: data files must all be one of {sorted(FORMATS)} (or one save_to_disk directory); "
            f"got {paths}"
        )
    (kind,) = kinds
    try:
        ds = datasets.load_dataset(kind, data_files=paths, split="train")
    except Exception as exc:  # the reader's own message names the file and what is wrong in it
        raise DatasetError(f"task {name}: cannot read {paths}: {type(exc).__name__}: {exc}") from None
    return {"train": ds.to_list()}


def _check_rows(name: str, conf: TaskConf, rows: list[DataRow], where: str) -> None:
    if not rows:
        raise DatasetError(f"task {name}: {where} has no rows")
    column = conf.messages or conf.prompt
    needed = [c for c in (column, conf.answer) if c]
    absent = [c for c in needed if c not in rows[0].columns]
    if absent:
        raise DatasetError(
            f"task {name}: {where} has no column {absent}; its columns: {sorted(rows[0].columns)}"
        )
    bad = [r.task_id for r in rows if not _opening_ok(r.columns.get(column), bool(conf.messages))]
    if bad:
        what = "a list of chat messages with role and content" if conf.messages else "non-empty text"
        raise DatasetError(
            f"task {name}: {where}: column {column!r} must be {what}; rows {bad[:10]}"
            f"{f' and {len(bad) - 10} more' if len(bad) > 10 else ''} are not "
            "(nothing is dropped silently: fix them)"
        )


def _opening_ok(value: Any, messages: bool) -> bool:
    if not messages:
        return isinstance(value, str) and bool(value.strip())
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    )


def load_object(spec: str, what: str = "reward") -> Callable[..., Any]:
    """`path/to/file.py:name` or `package.module:name` -> that function (or class)."""
    target, sep, fn_name = spec.rpartition(":")
    if not sep or not target or not fn_name:
        raise DatasetError(f"{what} {spec!r}: expected 'file.py:name' or 'module:name'")
    path = Path(target)
    if target.endswith(".py") and not path.exists():
        raise DatasetError(f"{what} {spec!r}: no such file {path}")
    try:
        if target.endswith(".py"):
            module_name = f"swarmrl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as exc:
        raise DatasetError(
            f"reward {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise DatasetError(f"{what} {spec!r}: {target} has no {fn_name!r}")
    return fn


def load_rows(name: str, conf: TaskConf) -> tuple[list[DataRow], list[DataRow]]:
    """The training and held-out rows: `eval_data`, else a saved `test` / `validation` split, else
    a `heldout` share of `data` carved with `split_seed`."""
    splits = _load_files(name, conf.data)
    rows = splits.get("train") or next(iter(splits.values()))
    train = [DataRow(f"{name}-{i}", row) for i, row in enumerate(rows)]
    held = _load_files(name, conf.eval_data) if conf.eval_data else splits
    # `eval_data`'s test / validation split, else its first; `data`'s, else a carve of its rows
    split = next((s for s in EVAL_SPLITS if s in held), next(iter(held)) if conf.eval_data else None)
    if split is not None:
        return train, [DataRow(f"{name}-eval{i}", row) for i, row in enumerate(held[split])]
    order = list(range(len(train)))
    random.Random(conf.split_seed).shuffle(order)
    n_eval = max(1, round(conf.heldout * len(train)))
    if n_eval >= len(train):
        raise DatasetError(
            f"task {name}: {len(train)} rows leave none to train on after heldout={conf.heldout}"
        )
    held_idx = set(order[:n_eval])
    return [r for i, r in enumerate(train) if i not in held_idx], [train[i] for i in sorted(held_idx)]


def train_stream(rows: list[DataRow], seed: int) -> Iterator[DataRow]:
    """Endless passes over `rows`, each shuffled from (seed, pass)."""
    for epoch in itertools.count():
        order = list(rows)
        random.Random(f"{seed}/{epoch}").shuffle(order)
        yield from order


class DataEnv:
    """One episode of a dataset task: the opening messages, one reply, then the reward (`settle`)."""

    def __init__(self, task: DataTask, row: DataRow) -> None:
        self.task, self.row = task, row
        self.reward = 0.0
        self.success = False
        self.completion: str | None = None

    def reset(self) -> list[Message]:
        return self.task.opening(self.row)

    def step(self, reply: Message) -> StepResult:
        if self.completion is not None:
            raise RuntimeError(f"step() after the episode ended ({self.row.task_id})")
        self.completion = message_text(reply)
        return StepResult(messages=[], done=True)

    async def settle(self) -> None:
        assert self.completion is not None, "settle() before the reply"
        self.reward = await self.task.score(self.row, self.completion)
        self.success = self.reward >= self.task.conf.success_at


class DataTask:
    """A dataset task's rows, splits and reward; `spec()` is what the rest of swarmrl plays."""

    def __init__(self, name: str, conf: TaskConf) -> None:
        self.name, self.conf = name, conf
        self.train, self.eval = load_rows(name, conf)
        _check_rows(name, conf, self.train, "the training rows")
        _check_rows(name, conf, self.eval, "the held-out rows")
        self.reward_fn = load_object(conf.reward)
        self.scorer = Scorer(self.reward_fn, conf.reward, conf.messages or conf.prompt)
        self.probe()
        self.fingerprint = self._fingerprint()

    def _fingerprint(self) -> str:
        """Hash of the rows and the settings that shape them (the warm-start cache key)."""
        h = hashlib.sha256(self.conf.model_dump_json(exclude={"weight", "clients", "concurrency"}).encode())
        for row in itertools.chain(self.train, self.eval):
            h.update(json.dumps(row.columns, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    def opening(self, row: DataRow) -> list[Message]:
        if self.conf.messages:
            return [dict(m) for m in row.columns[self.conf.messages]]
        system = [{"role": "system", "content": self.conf.system}] if self.conf.system else []
        return [*system, {"role": "user", "content": row.columns[self.conf.prompt]}]

    async def score(self, row: DataRow, completion: str) -> float:
        """The reward of `completion` for `row`, batched with its group's (`rewards.py`)."""
        reply: Any = [{"role": "assistant", "content": completion}] if self.conf.messages else completion
        return await self.scorer.score(row.columns, row.task_id, reply)

    def probe(self) -> None:
        """Score `PROBE` completions of the first row: a wrong shape stops the run, other failures are
        logged."""
        row = self.train[0]
        texts = [str(row.columns[self.conf.answer]) if self.conf.answer else PROBE[0], *PROBE[1:]]
        replies = [[{"role": "assistant", "content": t}] for t in texts] if self.conf.messages else texts
        try:
            errors = self.scorer.probe(row.columns, row.task_id, replies)
        except RewardError as exc:
            raise DatasetError(f"task {self.name}: {exc}") from None
        if errors:
            log.warning("task %s: the reward's start-up probe: %s", self.name, errors[0])

    def demonstrate(self, row: DataRow, rng: random.Random) -> list[Message]:
        return [*self.opening(row), {"role": "assistant", "content": str(row.columns[self.conf.answer])}]

    def spec(self) -> TaskSpec:
        conf = self.conf
        warm = self.train[: conf.warm_start_rows] if conf.warm_start_rows else self.train
        return TaskSpec(
            name=self.name,
            max_tokens=None,  # its author's to say (TaskConf.max_tokens)
            make_env=lambda row: DataEnv(self, row),
            train_tasks=lambda seed: train_stream(self.train, seed),
            eval_tasks=lambda: list(self.eval),
            demonstration=self.demonstrate if conf.answer else None,
            parse_reply=message_text,
            sft_tasks=lambda seed: train_stream(warm, seed),
            fingerprint=self.fingerprint,
        )


def data_task(name: str, conf: TaskConf) -> TaskSpec:
    """The `TaskSpec` of dataset task `name` (its rows loaded and checked, its reward imported)."""
    return DataTask(name, conf).spec()


def register_data_tasks(tasks: Mapping[str, TaskConf]) -> list[str]:
    """Build and register every dataset and env task of `tasks` in this process; their names."""
    from swarmrl.agents.tasks import register
    from swarmrl.agents.tasks.environment import env_task

    names = []
    for name, conf in tasks.items():
        if conf.own:
            register(env_task(name, conf) if conf.env else data_task(name, conf))
            names.append(name)
    return names


def write_tasks_file(path: Path, tasks: Mapping[str, TaskConf]) -> Path | None:
    """Write the dataset tasks of `tasks` to `path` (JSON) for the clients; None when there are none."""
    data = {name: conf.model_dump(mode="json") for name, conf in tasks.items() if conf.own}
    if not data:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def read_tasks_file(path: str | Path) -> list[str]:
    """Register the dataset tasks `write_tasks_file` wrote; returns their names."""
    data = json.loads(Path(path).read_text())
    return register_data_tasks({name: TaskConf.model_validate(conf) for name, conf in data.items()})
