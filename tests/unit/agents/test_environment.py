"""Environments in user code (`agents/tasks/environment.py`): instances from the class or from rows,
tools from typed functions, the tool loop, the turn cap, and the description's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarmrl.agents.config import TaskConf
from swarmrl.agents.tasks.dataset import DatasetError
from swarmrl.agents.tasks.environment import env_task

ENV = '''
import random


class Count:
    """How many letters has a word? The `letters` tool spells it out."""

    tools = ["letters"]

    def __init__(self, instance):
        self.word = instance["word"]
        self.reward, self.success = 0.0, False

    @staticmethod
    def train_instances(seed):
        rng = random.Random(seed)
        while True:
            yield {"word": rng.choice(["cat", "house", "tree"])}

    @staticmethod
    def eval_instances():
        return [{"word": "apple", "task_id": "count-apple"}]

    def reset(self):
        return f"How many letters are in {self.word}?"

    def letters(self, word: str) -> list:
        """Spell a word, one letter per item.

        Args:
            word: the word to spell
        """
        return list(word)

    def step(self, reply):
        self.success = (reply.get("content") or "").strip() == str(len(self.word))
        self.reward = float(self.success)
        return [{"role": "user", "content": "thanks"}], True


class Bare:
    def __init__(self, instance):
        pass
'''


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "count.py").write_text(ENV)
    return tmp_path


def conf(folder: Path, **fields: Any) -> TaskConf:
    return TaskConf.model_validate({"env": "count.py:Count"} | fields).resolve_paths(folder)


def call(name: str, args: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def test_an_env_plays_with_its_tools_from_type_hints_and_docstrings(folder: Path) -> None:
    spec = env_task("count", conf(folder))
    (row,) = spec.eval_tasks()
    assert row.task_id == "count-apple"
    env = spec.make_env(row)
    assert env.reset() == [{"role": "user", "content": "How many letters are in apple?"}]
    assert env.tool_specs == [
        {
            "type": "function",
            "function": {
                "name": "letters",
                "description": "Spell a word, one letter per item.",
                "parameters": {
                    "type": "object",
                    "properties": {"word": {"type": "string", "description": "the word to spell"}},
                    "required": ["word"],
                },
            },
        }
    ]
    tool_turn = env.step(
        {"role": "assistant", "content": None, "tool_calls": [call("letters", {"word": "apple"})]}
    )
    assert not tool_turn.done
    assert tool_turn.messages == [
        {"role": "tool", "tool_call_id": "c1", "name": "letters", "content": '["a", "p", "p", "l", "e"]'}
    ]
    bad = env.step({"role": "assistant", "tool_calls": [call("spell", {}), call("letters", {"wrd": "x"})]})
    assert [m["content"].split(":")[0] for m in bad.messages] == ["error", "error"]
    assert "no tool 'spell'" in bad.messages[0]["content"] and "wrd" in bad.messages[1]["content"]
    last = env.step({"role": "assistant", "content": "5"})
    assert last.done and env.reward == 1.0 and env.success
    train = spec.train_tasks(0)
    assert {next(train).columns["word"] for _ in range(30)} <= {"cat", "house", "tree"}


def test_the_turn_cap_ends_an_episode_of_tool_calls(folder: Path) -> None:
    spec = env_task("count", conf(folder, max_turns=2))
    env = spec.make_env(spec.eval_tasks()[0])
    env.reset()
    first = env.step({"role": "assistant", "tool_calls": [call("letters", {"word": "a"})]})
    second = env.step({"role": "assistant", "tool_calls": [call("letters", {"word": "a"})]})
    assert not first.done and second.done and env.reward == 0.0


def test_instances_can_be_rows_of_data(folder: Path) -> None:
    (folder / "words.jsonl").write_text(
        "".join(json.dumps({"word": w}) + "\n" for w in ["ab", "abc", "abcd", "x"])
    )
    spec = env_task("count", conf(folder, data="words.jsonl", heldout=0.25))
    stream = spec.train_tasks(0)
    assert len(spec.eval_tasks()) == 1 and len({next(stream).task_id for _ in range(20)}) == 3
    env = spec.make_env(spec.eval_tasks()[0])
    assert env.reset()[0]["content"].startswith("How many letters are in ")


def test_what_is_wrong_with_an_env_is_said_at_start(folder: Path) -> None:
    with pytest.raises(DatasetError, match=r"needs data = \[...\] or a train_instances\(\) method"):
        env_task("bare", conf(folder, env="count.py:Bare"))
    with pytest.raises(DatasetError, match="has no 'Absent'"):
        env_task("x", conf(folder, env="count.py:Absent"))
    with pytest.raises(ValueError, match="an env task's reward is its environment's"):
        TaskConf(env="count.py:Count", data=["x.jsonl"], reward="r.py:f")
