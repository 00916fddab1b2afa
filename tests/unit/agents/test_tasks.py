"""The default tasks: environment steps, rewards, parsing, the safe evaluator, eval/train split."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from swarmrl.agents.tasks import TASKS, get_task
from swarmrl.agents.tasks.arith import ExpressionError, safe_eval
from swarmrl.agents.tasks.calculator import Calculator, CalculatorEnv
from swarmrl.agents.tasks.guess_number import GuessNumber, GuessNumberEnv


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def call(expression: str, call_id: str = "call_7") -> dict:
    arguments = json.dumps({"expression": expression})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        ],
    }


def test_guess_number_feedback_and_reward():
    env = GuessNumberEnv(GuessNumber(secret=10, n=16, max_turns=6))
    first = env.reset()
    assert [m["role"] for m in first] == ["system", "user"] and "between 1 and 16" in first[1]["content"]
    assert env.step(say("8")).messages == [{"role": "user", "content": "higher"}]
    assert env.step(say("My guess is 12.")).messages[0]["content"] == "lower"
    step = env.step(say("10"))
    assert step.done and step.messages[0]["content"] == "correct"
    assert env.success and env.reward == pytest.approx(1.0 - 0.2 * 2 / 5)
    with pytest.raises(RuntimeError):
        env.step(say("10"))


def test_guess_number_invalid_replies_waste_turns():
    env = GuessNumberEnv(GuessNumber(secret=3, n=16, max_turns=3))
    env.reset()
    for reply in ("three", "3 or 4", "17"):
        step = env.step(say(reply))
        assert step.messages[0]["content"].startswith("invalid") and not step.info["valid"]
    assert step.done and not env.success and env.reward == 0.0


def test_guess_number_first_turn_win_scores_one():
    env = GuessNumberEnv(GuessNumber(secret=5))
    env.reset()
    assert env.step(say("5")).done and env.reward == 1.0
    with pytest.raises(ValueError):
        GuessNumber(secret=0)


def test_calculator_tool_then_answer():
    task = Calculator("37 * 12 + 5")
    env = CalculatorEnv(task)
    assert env.reset()[1]["content"] == "What is 37 * 12 + 5?"
    step = env.step(call("37 * 12 + 5"))
    assert not step.done
    assert step.messages == [{"role": "tool", "tool_call_id": "call_7", "content": "449"}]
    step = env.step(say("449"))
    assert step.done and env.success and env.reward == 1.0


@pytest.mark.parametrize("answer", ["450", "", "I don't know"])
def test_calculator_wrong_or_missing_answer(answer):
    env = CalculatorEnv(Calculator("2 + 3 * 4"))
    env.reset()
    assert env.step(say(answer)).done and env.reward == 0.0 and not env.success


def test_calculator_answer_parsing_is_lenient_on_wording():
    env = CalculatorEnv(Calculator("40 * 40 + 40"))
    env.reset()
    env.step(say("40 * 40 + 40 = 1,640"))
    assert env.success


def test_calculator_bad_tool_calls_get_errors_and_turns_run_out():
    env = CalculatorEnv(Calculator("2 + 2", max_turns=2))
    env.reset()
    bad = {
        "role": "assistant",
        "tool_calls": [{"id": "x", "function": {"name": "calculator", "arguments": "{oops"}}],
    }
    assert env.step(bad).messages[0]["content"].startswith("error")
    step = env.step(call("__import__('os')"))
    assert step.messages[0]["content"].startswith("error") and step.done and env.reward == 0.0


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "(1).real",
        "[1, 2]",
        "'a' * 3",
        "2 ** 1000",
        "1 / 0",
        "9" * 300,
        "lambda: 1",
        "True + 1",
    ],
)
def test_safe_eval_rejects(expression):
    with pytest.raises(ExpressionError):
        safe_eval(expression)


def test_safe_eval_arithmetic():
    assert safe_eval("37 * 12 + 5") == 449
    assert safe_eval(" -(2 + 3) * 4 // 3 % 5 ") == 3
    assert safe_eval("2 ** 10 / 4") == 256.0


@pytest.mark.parametrize("name", sorted(TASKS))
def test_eval_set_is_fixed_and_disjoint_from_training(name):
    spec = get_task(name)
    held_out = spec.eval_tasks()
    assert [t.task_id for t in held_out] == [t.task_id for t in spec.eval_tasks()]
    assert len({t.task_id for t in held_out}) == len(held_out) >= 16
    training = {t.task_id for t in itertools.islice(spec.train_tasks(0), 2000)}
    assert not training & {t.task_id for t in held_out}
    assert [t.task_id for t in itertools.islice(spec.train_tasks(5), 20)] == [
        t.task_id for t in itertools.islice(spec.train_tasks(5), 20)
    ]


# Multi-role tasks have per-role demonstrations, replayed in their own tests (test_team_calculator.py).
@pytest.mark.parametrize("name", sorted(name for name, spec in TASKS.items() if not spec.roles))
def test_demonstrations_replay_through_the_env(name):
    """Demonstrations are well-formed and win sometimes, not always (room left for RL)."""
    spec = get_task(name)
    rng, wins, episodes = random.Random(0), 0, 200
    for task in itertools.islice(spec.train_tasks(1), episodes):
        messages = spec.demonstration(task, rng)
        env = spec.make_env(task)
        assert messages[:2] == env.reset()
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                assert spec.parse_reply(message) is not None
                step = env.step(message)
                assert messages[i + 1 : i + 1 + len(step.messages)] == step.messages
        assert env.done
        wins += env.success
    assert 0.2 < wins / episodes < 0.8


def test_registry_error_names_known_tasks():
    with pytest.raises(KeyError, match="calculator"):
        get_task("nope")
