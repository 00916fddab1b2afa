"""Dataset tasks (`agents/tasks/dataset.py`): files in every format, held-out splits, the reward
function's calling convention and its failures, warm-start demonstrations, the swarm description."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import datasets
import pytest

from swarmrl.agents.config import TaskConf
from swarmrl.agents.tasks import TASKS
from swarmrl.agents.tasks.dataset import DataEnv, DatasetError, DataTask, RewardError, data_task
from swarmrl.core.config import SwarmConfigError
from swarmrl.swarm import build, load

ROWS = [{"question": f"What is {i} plus 1?", "answer": i + 1, "kind": "add"} for i in range(40)]

REWARD = """
import asyncio, math

CALLS = []

def exact(prompts, completions, answer, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [1.0 if str(a) in c else 0.0 for c, a in zip(completions, answer)]

async def exact_async(prompts, completions, answer, **kwargs):
    await asyncio.sleep(0)
    return exact(prompts, completions, answer, **kwargs)

def chat(prompts, completions, **kwargs):
    assert isinstance(prompts[0], list) and completions[0][0]["role"] == "assistant"
    return [float(len(c[0]["content"])) for c in completions]

def boom(prompts, completions, **kwargs):
    raise ZeroDivisionError("the user's bug")

def nan(prompts, completions, **kwargs):
    return [math.nan] * len(completions)

def two(prompts, completions, **kwargs):
    return [1.0, 0.0]

def scalar(prompts, completions, **kwargs):
    return 1.0
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "rewards.py").write_text(REWARD)
    with (tmp_path / "rows.jsonl").open("w") as f:
        for row in ROWS:
            f.write(json.dumps(row) + "\n")
    return tmp_path


def conf(folder: Path, **fields: Any) -> TaskConf:
    base = {"data": ["rows.jsonl"], "prompt": "question", "reward": "rewards.py:exact", "answer": "answer"}
    return TaskConf.model_validate(base | fields).resolve_paths(folder)


def write_formats(folder: Path) -> dict[str, list[str]]:
    """The same rows as JSONL, Parquet, CSV, and a `save_to_disk` directory."""
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(folder / "rows.parquet"))
    ds.to_csv(str(folder / "rows.csv"), index=False)
    ds.save_to_disk(str(folder / "saved"))
    return {"jsonl": ["rows.jsonl"], "parquet": ["rows.parquet"], "csv": ["rows.csv"], "disk": ["saved"]}


def test_every_file_format_gives_the_same_rows_and_held_out_split(folder: Path) -> None:
    tasks = {kind: DataTask("t", conf(folder, data=paths)) for kind, paths in write_formats(folder).items()}
    reference = tasks["jsonl"]
    assert len(reference.train) == 36 and len(reference.eval) == 4  # heldout 0.1 of 40
    assert {r.task_id for r in reference.train}.isdisjoint({r.task_id for r in reference.eval})
    for kind, task in tasks.items():
        got = [(r.task_id, r.columns["question"], int(r.columns["answer"])) for r in task.eval + task.train]
        want = [
            (r.task_id, r.columns["question"], r.columns["answer"]) for r in reference.eval + reference.train
        ]
        assert got == want, kind
    # another split seed carves other rows; the same seed always the same ones
    other = DataTask("t", conf(folder, split_seed=1))
    assert [r.task_id for r in other.eval] != [r.task_id for r in reference.eval]
    assert [r.task_id for r in DataTask("t", conf(folder)).eval] == [r.task_id for r in reference.eval]


def test_held_out_rows_come_from_eval_data_or_a_saved_test_split(folder: Path) -> None:
    with (folder / "held.jsonl").open("w") as f:
        f.write(json.dumps({"question": "What is 100 plus 1?", "answer": 101, "kind": "add"}) + "\n")
    given = DataTask("t", conf(folder, eval_data="held.jsonl"))
    assert len(given.train) == 40 and [r.task_id for r in given.eval] == ["t-eval0"]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:30]), "test": datasets.Dataset.from_list(ROWS[30:])}
    ).save_to_disk(str(folder / "dict"))
    saved = DataTask("t", conf(folder, data="dict"))
    assert len(saved.train) == 30 and [r.columns["answer"] for r in saved.eval] == [31 + i for i in range(10)]


def test_an_episode_is_one_reply_scored_with_trls_convention(folder: Path) -> None:
    spec = data_task("t", conf(folder, system="Answer with the number."))
    row = spec.eval_tasks()[0]
    env = spec.make_env(row)
    assert env.reset() == [
        {"role": "system", "content": "Answer with the number."},
        {"role": "user", "content": row.columns["question"]},
    ]
    assert env.step({"role": "assistant", "content": f"It is {row.columns['answer']}"}).done
    asyncio.run(env.settle())
    assert env.reward == 1.0 and env.success
    call = env.task.reward_fn.__globals__["CALLS"][-1]  # what the user's function was called with
    assert call == {
        "prompts": [row.columns["question"]], "completions": [f"It is {row.columns['answer']}"],
        "answer": [row.columns["answer"]], "kind": ["add"],
    }  # fmt: skip
    wrong = spec.make_env(row)
    wrong.reset()
    wrong.step({"role": "assistant", "content": "no idea"})
    asyncio.run(wrong.settle())
    assert wrong.reward == 0.0 and not wrong.success


def test_an_async_reward_and_a_messages_column(folder: Path) -> None:
    spec = data_task("t", conf(folder, reward="rewards.py:exact_async"))
    env = spec.make_env(spec.eval_tasks()[0])
    env.reset()
    env.step({"role": "assistant", "content": str(spec.eval_tasks()[0].columns["answer"])})
    asyncio.run(env.settle())
    assert env.reward == 1.0
    rows = [{"chat": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in ROWS]
    (folder / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = data_task("c", conf(folder, data="chat.jsonl", messages="chat", reward="rewards.py:chat"))
    env = chat.make_env(chat.eval_tasks()[0])
    assert env.reset() == chat.eval_tasks()[0].columns["chat"]
    env.step({"role": "assistant", "content": "four"})
    asyncio.run(env.settle())
    assert env.reward == 4.0


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        ("boom", "raised ZeroDivisionError: the user's bug"),
        ("nan", "returned nan for the completion: need a finite number"),
        ("two", "need a list with one float per completion"),
    ],
)
def test_a_failing_reward_is_an_error_naming_the_function_and_the_row(
    folder: Path, fn: str, says: str
) -> None:
    spec = data_task("t", conf(folder, reward=f"rewards.py:{fn}"))
    env: DataEnv = spec.make_env(spec.eval_tasks()[0])
    env.reset()
    env.step({"role": "assistant", "content": "1"})
    with pytest.raises(RewardError) as err:
        asyncio.run(env.settle())
    assert f"rewards.py:{fn} on {spec.eval_tasks()[0].task_id}" in str(err.value) and says in str(err.value)


def test_a_reward_of_the_wrong_shape_is_refused_at_start(folder: Path) -> None:
    """The reward is called once on a probe row when the task is built (before any process starts)."""
    with pytest.raises(DatasetError, match=r"need a list with one float per completion") as err:
        DataTask("t", conf(folder, reward="rewards.py:scalar"))
    assert str(err.value).startswith(
        "task t: the start-up probe: reward "
    ) and "rewards.py:scalar on t-" in str(err.value)
    assert "returned 1.0 for 2 completions" in str(err.value)
    print("a reward author sees:", err.value)


def test_bad_input_is_refused_with_what_to_fix(folder: Path) -> None:
    with pytest.raises(
        DatasetError, match=r"no column \['prompt'\]; its columns: \['answer', 'kind', 'question'\]"
    ):
        DataTask("t", conf(folder, prompt="prompt"))
    rows = [
        *ROWS[:10],
        {"question": "  ", "answer": 1, "kind": "add"},
        {"question": None, "answer": 2, "kind": "add"},
    ]
    (folder / "holes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"must be non-empty text; rows \['t-1[01]'(, 't-11')?\]"):
        DataTask("t", conf(folder, data="holes.jsonl", heldout=0.5))
    with pytest.raises(DatasetError, match="no such data file"):
        DataTask("t", conf(folder, data="absent.jsonl"))
    (folder / "rows.txt").write_text("x")
    with pytest.raises(DatasetError, match="must all be one of"):
        DataTask("t", conf(folder, data="rows.txt"))
    with pytest.raises(DatasetError, match="has no 'absent'"):
        DataTask("t", conf(folder, reward="rewards.py:absent"))
    with pytest.raises(DatasetError, match="no such file"):
        DataTask("t", conf(folder, reward="missing.py:f"))


def test_warm_start_demonstrations_come_from_the_answer_column_of_the_first_rows(folder: Path) -> None:
    spec = data_task("t", conf(folder, warm_start_rows=5))
    assert spec.sft_tasks is not None and spec.demonstration is not None
    warm = {r.task_id for r, _ in zip(spec.sft_tasks(0), range(50), strict=False)}
    assert len(warm) == 5  # only the first 5 training rows, however long the warm start
    row = next(spec.sft_tasks(0))
    demo = spec.demonstration(row, random.Random(0))
    assert demo[-1] == {"role": "assistant", "content": str(row.columns["answer"])}
    # without an answer column the task plays, but cannot be a warm-start source
    assert data_task("t", conf(folder, answer="")).demonstration is None
    # other rows, another fingerprint (the warm-started model's cache key)
    (folder / "fewer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:20]))
    assert data_task("t", conf(folder, data="fewer.jsonl")).fingerprint != spec.fingerprint


@pytest.fixture
def tasks_restored() -> Any:
    """`build` registers dataset tasks in this process's `TASKS`: leave it as it was."""
    before = dict(TASKS)
    yield
    TASKS.clear()
    TASKS.update(before)


def test_the_swarm_description_resolves_paths_against_its_folder_and_registers_the_task(
    folder: Path, monkeypatch: pytest.MonkeyPatch, tasks_restored: None
) -> None:
    (folder / "swarm.toml").write_text(
        '[models.policy]\n[tasks.sums]\ndata = "rows.jsonl"\nprompt = "question"\nreward = "rewards:exact"\n'
    )
    monkeypatch.chdir("/")
    swarm = build(load(folder / "swarm.toml"), str(folder / "swarm.toml"))
    t = swarm.tasks["sums"]
    assert t.data == [str(folder / "rows.jsonl")] and t.reward == f"{folder / 'rewards.py'}:exact"
    assert "sums" in TASKS and len(TASKS["sums"].eval_tasks()) == 4
    (folder / "bad.toml").write_text(
        '[models.policy]\n[tasks.calculator]\ndata = "rows.jsonl"\nreward = "rewards:exact"\n'
    )
    with pytest.raises(SwarmConfigError, match="calculator is a built-in task"):
        build(load(folder / "bad.toml"), str(folder / "bad.toml"))
    (folder / "noreward.toml").write_text('[models.policy]\n[tasks.sums]\ndata = "rows.jsonl"\n')
    with pytest.raises(SwarmConfigError, match="a dataset task needs reward"):
        build(load(folder / "noreward.toml"), str(folder / "noreward.toml"))
    (folder / "missing.toml").write_text(
        '[models.policy]\n[tasks.sums]\ndata = "nope.jsonl"\nprompt = "question"\nreward = "rewards:exact"\n'
    )
    with pytest.raises(SwarmConfigError, match="no such data file"):
        build(load(folder / "missing.toml"), str(folder / "missing.toml"))
