"""`team_calculator`: a two-role team task, each role meant for its own model.

    caller    sees the question with the calculator tool; must reply with one calculator call.
    reporter  sees "Question: ...\\nCalculator result: 36", no tools; replies with the final number.

Unless the caller's reply is exactly one call the tool turns into a number, the team fails and the
reporter never acts. Each role's reward is its own part: the caller's 1 when the tool's value is the
true answer, the reporter's 1 when it reports the tool's number (right or wrong).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from swarmrl.agents.tasks.arith import ExpressionError, Number, format_number, safe_eval
from swarmrl.agents.tasks.base import Message, TaskSpec, Turn
from swarmrl.agents.tasks.calculator import (
    TOOLS,
    Question,
    _mistype,
    parse_reply,
    tool_call,
)

CALLER, REPORTER = "caller", "reporter"
ROLES = (CALLER, REPORTER)
CALLER_PROMPT = "You are the caller. Call the calculator tool with the expression of the question."
REPORTER_PROMPT = "You are the reporter. Reply with the calculator result as the final number only."
ROLE_METRICS = {CALLER: "caller_valid", REPORTER: "reporter_correct"}


@dataclass(frozen=True)
class TeamCalculator(Question):
    prefix: ClassVar[str] = "team_calculator"


def _close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < 1e-6


class TeamCalculatorEnv:
    """One episode (a `MultiRoleEnv`): caller turn, tool, then reporter turn when the tool gave a number."""

    def __init__(self, task: TeamCalculator) -> None:
        self.task = task
        self.done = False
        self.success = False
        self.rewards: dict[str, float] = {}
        self.metrics: dict[str, float] = {}
        self.tool_value: Number | None = None  # None: no valid call, or a tool error
        self.final_answer: float | None = None
        self._turn: Turn | None = Turn(
            CALLER,
            [{"role": "system", "content": CALLER_PROMPT}, {"role": "user", "content": task.question()}],
            TOOLS,
        )

    def turn(self) -> Turn | None:
        return None if self.done else self._turn

    def step(self, reply: Message) -> None:
        if self._turn is None or self.done:
            raise RuntimeError(f"step() after the episode ended ({self.task.task_id})")
        if self._turn.role == CALLER:
            self._caller_step(reply)
        else:
            self._reporter_step(reply)

    def _caller_step(self, reply: Message) -> None:
        expressions = parse_reply(reply).expressions
        # exactly one call: several would let the caller hedge
        if len(expressions) == 1 and expressions[0] is not None:
            try:
                self.tool_value = safe_eval(expressions[0])
            except ExpressionError:
                self.tool_value = None
        correct = _close(self.tool_value, self.task.answer)
        self.rewards[CALLER] = self.metrics[ROLE_METRICS[CALLER]] = 1.0 if correct else 0.0
        if self.tool_value is None:
            self._turn, self.done = None, True
            return
        user = f"Question: {self.task.question()}\nCalculator result: {format_number(self.tool_value)}"
        self._turn = Turn(
            REPORTER,
            [{"role": "system", "content": REPORTER_PROMPT}, {"role": "user", "content": user}],
            None,
        )

    def _reporter_step(self, reply: Message) -> None:
        # A reply with tool calls has no answer (the reporter has no tools).
        self.final_answer = parse_reply(reply).answer
        faithful = _close(self.final_answer, self.tool_value)
        self.rewards[REPORTER] = self.metrics[ROLE_METRICS[REPORTER]] = 1.0 if faithful else 0.0
        self.success = _close(self.final_answer, self.task.answer)
        self._turn, self.done = None, True


eval_tasks = TeamCalculator.held_out
train_tasks = TeamCalculator.training


def oracle(task: TeamCalculator, turn: Turn) -> Message:
    """A correct reply for either role: the exact expression, or the tool's result copied."""
    if turn.role == CALLER:
        return tool_call(task.expression)
    result = str(turn.messages[-1]["content"]).rsplit("Calculator result: ", 1)[-1]
    return {"role": "assistant", "content": result}


# Demonstration noise: each warm-started model scores about half on its own metric (right format,
# room for RL).
CALLER_NOISE = {"p_guess": 0.4, "p_mistype": 0.1}
REPORTER_NOISE = {"p_guess": 0.35, "p_mistype": 0.15}


def role_demonstrations(task: TeamCalculator, rng: random.Random) -> dict[str, list[Message]]:
    """Per role, a conversation ending in that role's reply: a text guess with `p_guess`, else the
    call (caller) or the result copied (reporter), a digit mistyped with `p_mistype`. The reporter
    sees a correct call's result when the caller's gave none."""
    env = TeamCalculatorEnv(task)
    turn = env.turn()
    assert turn is not None
    if rng.random() < CALLER_NOISE["p_guess"]:
        reply: Message = {"role": "assistant", "content": str(rng.randint(10, 99))}
    else:
        mistyped = rng.random() < CALLER_NOISE["p_mistype"]
        reply = tool_call(_mistype(task.expression, rng) if mistyped else task.expression)
    demos = {CALLER: [*turn.messages, reply]}
    env.step(reply)
    if env.done:  # no number from the caller: show the reporter what a correct call leads to
        env = TeamCalculatorEnv(task)
        env.step(tool_call(task.expression))
    turn = env.turn()
    assert turn is not None and turn.role == REPORTER
    assert env.tool_value is not None
    result = format_number(env.tool_value)
    if rng.random() < REPORTER_NOISE["p_guess"]:
        answer = str(rng.randint(10, 99))
    else:
        answer = _mistype(result, rng) if rng.random() < REPORTER_NOISE["p_mistype"] else result
    demos[REPORTER] = [*turn.messages, {"role": "assistant", "content": answer}]
    return demos


SPEC = TaskSpec(
    name="team_calculator",
    make_env=TeamCalculatorEnv,
    train_tasks=train_tasks,
    eval_tasks=eval_tasks,
    demonstration=None,
    parse_reply=parse_reply,
    roles=ROLES,
    role_metrics=ROLE_METRICS,
    role_demonstrations=role_demonstrations,
    role_tools={CALLER: TOOLS},
    role_sft_weights={CALLER: 2, REPORTER: 3},
    role_oracle=oracle,
)
