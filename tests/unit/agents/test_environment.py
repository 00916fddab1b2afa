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


class NoStep(Count):
    step = None


class NoReward:
    tools = []
    train_instances, eval_instances = Count.train_instances, Count.eval_instances

    def __init__(self, instance):
        self.success = False

    def reset(self):
        return "hi"

    def step(self, reply):
        return [], False


class OneValue(Count):
    def step(self, reply):
        return True
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


def test_the_start_up_probe_checks_the_whole_shape_on_one_instance(folder: Path) -> None:
    """Reset and one step on a held-out instance: what every episode would trip on stops the run now."""
    with pytest.raises(
        DatasetError, match=r"task t: env .*count.py:NoStep has no step\(\) method"
    ) as no_step:
        env_task("t", conf(folder, env="count.py:NoStep"))
    with pytest.raises(
        DatasetError, match=r"NoReward has no 'reward' attribute: need `reward: float`"
    ) as no_reward:
        env_task("t", conf(folder, env="count.py:NoReward"))
    with pytest.raises(DatasetError, match=r"step\(\) returned True: need \(messages to add, done\)") as one:
        env_task("t", conf(folder, env="count.py:OneValue"))
    for err in (no_step, no_reward, one):
        print("an env author sees:", err.value)


SANDBOXED = '''
import json


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


class Adder:
    tools = [add]

    def __init__(self, instance):
        self.reward, self.success = 0.0, False

    @staticmethod
    def train_instances(seed):
        while True:
            yield {"task_id": "add"}

    @staticmethod
    def eval_instances():
        return [{"task_id": "add"}]

    def reset(self):
        return "What is 2 + 3?"

    def step(self, reply):
        self.success = (reply.get("content") or "").strip() == "5"
        self.reward = float(self.success)
        return [], True
'''


def test_sandboxed_tools_are_the_files_own_functions_run_as_a_program(folder: Path) -> None:
    import subprocess
    import sys

    (folder / "adder.py").write_text(SANDBOXED)
    spec = env_task("adder", TaskConf(env="adder.py:Adder", sandbox=True).resolve_paths(folder))
    assert spec.tool_actions is not None
    reply = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}},
            {"id": "c2", "function": {"name": "add", "arguments": json.dumps({"a": "x"})}},
            {"id": "c3", "function": {"name": "rm", "arguments": "{}"}},
        ],
    }
    first, second, unknown = spec.tool_actions(reply)
    assert unknown is None  # not a tool of the env: answered by the env itself, not the sandbox
    outputs = []
    for action in (first, second):  # what the sandbox runs: the file as a program, the call on stdin
        assert action is not None
        run = subprocess.run([sys.executable, "-I", "-c", action["code"]], input=action["stdin"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        outputs.append(run.stdout.strip())
    assert outputs[0] == "5" and outputs[1].startswith("error: TypeError")
    env = spec.make_env(spec.eval_tasks()[0])
    env.reset()
    step = env.step(reply, tool_results=[outputs[0], outputs[1], None])
    assert [m["content"] for m in step.messages][:2] == ["5", outputs[1]] and not step.done
    assert step.messages[2]["content"].startswith("error: ValueError: no tool 'rm'")


def test_sandboxed_tools_must_be_plain_functions(folder: Path) -> None:
    (folder / "count.py").write_text(ENV)
    with pytest.raises(DatasetError, match=r"sandbox = true runs plain functions.*\['letters'\] are methods"):
        env_task("count", TaskConf(env="count.py:Count", sandbox=True).resolve_paths(folder))
    assert env_task("count", TaskConf(env="count.py:Count").resolve_paths(folder)).tool_actions is None


TEAM = '''
class Relay:
    """A caller asks the reporter (who has a tool) for a number, then says it."""

    roles = ("caller", "reporter")
    tools = {"reporter": ["lookup"]}

    def __init__(self, instance):
        self.said = []
        self.rewards, self.success, self.done = {}, False, False

    @staticmethod
    def train_instances(seed):
        while True:
            yield {"task_id": "relay"}

    @staticmethod
    def eval_instances():
        return [{"task_id": "relay"}]

    def lookup(self, key: str) -> int:
        """Look a number up.

        Args:
            key: what to look up
        """
        return 42

    def turn(self):
        if self.done:
            return None
        if not self.said:
            return "caller", "Ask for the number."
        return "reporter", [{"role": "user", "content": "Tell the number: " + self.said[0]}]

    def step(self, reply):
        self.said.append(reply.get("content") or "")
        if len(self.said) == 2:
            self.done, self.success = True, "42" in self.said[1]
            self.rewards = {"caller": 1.0, "reporter": float(self.success)}
'''


def test_a_team_env_gives_each_role_its_turns_and_runs_a_roles_tools(folder: Path) -> None:
    (folder / "relay.py").write_text(TEAM)
    roles = {"caller": "a", "reporter": "b"}
    spec = env_task("relay", TaskConf(env="relay.py:Relay", roles=roles, max_turns=6).resolve_paths(folder))
    assert spec.roles == ("caller", "reporter")
    env = spec.make_env(spec.eval_tasks()[0])
    first = env.turn()
    assert (first.role, first.messages, first.tools) == (
        "caller",
        [{"role": "user", "content": "Ask for the number."}],
        None,
    )
    env.step({"role": "assistant", "content": "the number?"})
    second = env.turn()
    assert second.role == "reporter" and second.tools[0]["function"]["name"] == "lookup"
    call = {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "function": {"name": "lookup", "arguments": '{"key": "n"}'}}],
    }
    env.step(call)  # a tool round: the reporter gets the result and goes on, the env sees nothing yet
    again = env.turn()
    assert again.role == "reporter" and again.messages[-2:] == [
        call,
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "42"},
    ]
    env.step({"role": "assistant", "content": "It is 42."})
    assert env.turn() is None and env.done and env.success and env.rewards == {"caller": 1.0, "reporter": 1.0}
    with pytest.raises(DatasetError, match=r"has roles \['caller', 'reporter'\].*give roles = "):
        env_task("relay", TaskConf(env="relay.py:Relay").resolve_paths(folder))
    with pytest.raises(DatasetError, match="a single-agent env takes no roles"):
        env_task("count", TaskConf(env="count.py:Count", roles={"x": "a"}).resolve_paths(folder))
