"""team_calculator: the two-role env (turns, rewards, metrics), its eval split and its demonstrations."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from swarmrl.agents.tasks import TASKS, get_task
from swarmrl.agents.tasks.calculator import TOOLS
from swarmrl.agents.tasks.team_calculator import (
    CALLER_PROMPT,
    REPORTER_PROMPT,
    TeamCalculator,
    TeamCalculatorEnv,
    eval_tasks,
    oracle,
    train_tasks,
)

SPEC = get_task("team_calculator")


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def call(*expressions: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": e})},
            }
            for i, e in enumerate(expressions)
        ],
    }


def play(env: TeamCalculatorEnv, *replies: dict) -> list[str]:
    """Feed replies turn by turn; returns the roles whose turns they answered."""
    roles = []
    for reply in replies:
        turn = env.turn()
        assert turn is not None
        roles.append(turn.role)
        env.step(reply)
    return roles


def test_spec_declares_roles_metrics_and_tools():
    assert "team_calculator" in TASKS
    assert SPEC.roles == ("caller", "reporter")
    assert SPEC.role_metrics == {"caller": "caller_valid", "reporter": "reporter_correct"}
    assert SPEC.role_tools == {"caller": TOOLS} and SPEC.demonstration is None
    # The single-agent tasks are unchanged: no roles.
    assert TASKS["calculator"].roles == () and TASKS["guess_number"].roles == ()


def test_caller_then_reporter_team_wins():
    env = TeamCalculatorEnv(TeamCalculator("7 * 4 + 8"))
    turn = env.turn()
    assert turn is not None and turn.role == "caller" and turn.tools == TOOLS
    assert turn.messages == [
        {"role": "system", "content": CALLER_PROMPT},
        {"role": "user", "content": "What is 7 * 4 + 8?"},
    ]
    env.step(call("7 * 4 + 8"))
    turn = env.turn()
    assert turn is not None and turn.role == "reporter" and turn.tools is None
    assert turn.messages == [
        {"role": "system", "content": REPORTER_PROMPT},
        {"role": "user", "content": "Question: What is 7 * 4 + 8?\nCalculator result: 36"},
    ]
    assert not env.done
    env.step(say("36"))
    assert env.done and env.turn() is None and env.success
    assert env.rewards == {"caller": 1.0, "reporter": 1.0}
    assert env.metrics == {"caller_valid": 1.0, "reporter_correct": 1.0}
    with pytest.raises(RuntimeError):
        env.step(say("36"))


def test_a_wrong_call_is_reported_faithfully_but_the_team_fails():
    env = TeamCalculatorEnv(TeamCalculator("7 * 4 + 8"))
    assert play(env, call("7 * 4 + 9"), say("The answer is 37.")) == ["caller", "reporter"]
    assert env.rewards == {"caller": 0.0, "reporter": 1.0}
    assert env.metrics == {"caller_valid": 0.0, "reporter_correct": 1.0}
    assert env.done and not env.success


def test_a_reporter_that_corrects_the_tool_is_not_faithful():
    """The reporter is scored on the number it was given, even when it happens to be right."""
    env = TeamCalculatorEnv(TeamCalculator("7 * 4 + 8"))
    play(env, call("7 * 4 + 9"), say("36"))
    assert env.rewards == {"caller": 0.0, "reporter": 0.0} and env.success


@pytest.mark.parametrize("answer", ["35", "", "36 or 37", "I don't know"])
def test_reporter_misreports(answer):
    env = TeamCalculatorEnv(TeamCalculator("7 * 4 + 8"))
    play(env, call("7 * 4 + 8"), say(answer))
    assert env.rewards["caller"] == 1.0 and env.metrics["caller_valid"] == 1.0
    assert env.rewards["reporter"] == 0.0 and env.metrics["reporter_correct"] == 0.0
    # "36 or 37" ends on 37: the last number is the answer, as in `calculator`.
    assert not env.success


@pytest.mark.parametrize(
    "reply",
    [
        say("36"),  # a text guess, even a right one, is no call
        call("7 * 4 + 8", "7 * 4 + 9"),  # hedging with two calls
        call("__import__('os')"),  # the tool refuses it
        call("1 / 0"),
        {
            "role": "assistant",
            "tool_calls": [{"id": "x", "function": {"name": "calculator", "arguments": "{oops"}}],
        },
        {"role": "assistant", "tool_calls": [{"id": "x", "function": {"name": "search", "arguments": "{}"}}]},
    ],
)
def test_no_valid_call_ends_the_episode_without_the_reporter(reply):
    env = TeamCalculatorEnv(TeamCalculator("7 * 4 + 8"))
    env.step(reply)
    assert env.done and env.turn() is None and not env.success
    assert env.rewards == {"caller": 0.0}
    assert env.metrics == {"caller_valid": 0.0}  # reporter_correct absent: the reporter never acted


def test_eval_set_is_fixed_and_disjoint_from_training():
    held_out = eval_tasks()
    assert [t.task_id for t in held_out] == [t.task_id for t in eval_tasks()]
    assert len({t.task_id for t in held_out}) == len(held_out) == 64
    assert all(t.task_id.startswith("team_calculator/") for t in held_out)
    assert all(10 <= t.answer <= 99 for t in held_out)
    training = {t.task_id for t in itertools.islice(train_tasks(0), 2000)}
    assert not training & {t.task_id for t in held_out}
    assert [t.task_id for t in itertools.islice(train_tasks(5), 20)] == [
        t.task_id for t in itertools.islice(train_tasks(5), 20)
    ]
    # Its own held-out set, not calculator's.
    calculator = [t.expression for t in TASKS["calculator"].eval_tasks()]
    assert [t.expression for t in held_out] != calculator


def test_oracle_wins_every_eval_question():
    for task in eval_tasks():
        env = TeamCalculatorEnv(task)
        while (turn := env.turn()) is not None:
            env.step(oracle(task, turn))
        assert env.success and env.rewards == {"caller": 1.0, "reporter": 1.0}


def test_demonstrations_have_each_roles_format_and_replay_through_the_env():
    """Every demo is what the env shows that role, ending in a well-formed reply; noisy, not hopeless."""
    assert SPEC.role_demonstrations is not None
    rng, episodes = random.Random(0), 400
    rewards = {"caller": 0.0, "reporter": 0.0}
    kinds = {"call": 0, "text": 0}
    for task in itertools.islice(train_tasks(1), episodes):
        demos = SPEC.role_demonstrations(task, rng)
        assert set(demos) == {"caller", "reporter"}
        caller, reporter = demos["caller"], demos["reporter"]
        env = TeamCalculatorEnv(task)
        turn = env.turn()
        assert turn is not None and caller[:-1] == turn.messages and caller[-1]["role"] == "assistant"
        kinds["call" if caller[-1].get("tool_calls") else "text"] += 1
        env.step(caller[-1])
        rewards["caller"] += env.rewards["caller"]
        if env.done:  # a guessing caller: the reporter's demo shows what a correct call gives
            env = TeamCalculatorEnv(task)
            env.step(oracle(task, env.turn()))  # type: ignore[arg-type]
        turn = env.turn()
        assert turn is not None and reporter[:-1] == turn.messages
        assert reporter[-1]["role"] == "assistant" and reporter[-1]["content"].lstrip("-").isdigit()
        env.step(reporter[-1])
        rewards["reporter"] += env.rewards["reporter"]
    assert 0.45 < rewards["caller"] / episodes < 0.75
    assert 0.45 < rewards["reporter"] / episodes < 0.8
    assert kinds["call"] > kinds["text"] > 0
