"""`team_calculator`: a two-role team task, each role meant for its own model.

    caller    sees  [system, user "What is 7 * 4 + 8?"] with the calculator tool;
              must reply with one `calculator({"expression": ...})` call. The env runs the tool.
    reporter  sees  [system, user "Question: What is 7 * 4 + 8?\\nCalculator result: 36"], no tools;
              replies with the final number.

The episode ends after the caller when its reply is not exactly one call that the tool turns into a
number (a text guess, a malformed call, an expression the tool rejects): the team fails and the
reporter never acts. Rewards are per role and measure each role's own part: the caller gets 1 when
the tool's value equals the true answer, the reporter gets 1 when it reports the number the tool
returned (faithfully, right or wrong). The team succeeds when the final answer is the true answer.

Questions are `calculator`'s (one-digit operands, two-digit answers) with their own held-out set.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from swarmrl.agents.tasks.arith import ExpressionError, Number, format_number, safe_eval
from swarmrl.agents.tasks.base import Message, TaskSpec, Turn
from swarmrl.agents.tasks.calculator import (
    TOOLS,
    _mistype,
    held_out_questions,
    parse_reply,
    training_questions,
)

CALLER, REPORTER = "caller", "reporter"
ROLES = (CALLER, REPORTER)
CALLER_PROMPT = "You are the caller. Call the calculator tool with the expression of the question."
REPORTER_PROMPT = "You are the reporter. Reply with the calculator result as the final number only."
ROLE_METRICS = {CALLER: "caller_valid", REPORTER: "reporter_correct"}


@dataclass(frozen=True)
class TeamCalculator:
    """One question. `task_id` is the expression without spaces."""

    expression: str

    @property
    def task_id(self) -> str:
        return "team_calculator/" + self.expression.replace(" ", "")

    @property
    def answer(self) -> Number:
        return safe_eval(self.expression)

    def question(self) -> str:
        return f"What is {self.expression}?"


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
        self.tool_value: Number | None = None
        """What the tool returned to the caller's call (None: no valid call, or a tool error)."""
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
        # Exactly one call: several would let the caller hedge and leave the reporter to pick.
        if len(expressions) == 1 and expressions[0] is not None:
            try:
                self.tool_value = safe_eval(expressions[0])
            except ExpressionError:
                self.tool_value = None
        correct = _close(self.tool_value, self.task.answer)
        self.rewards[CALLER] = 1.0 if correct else 0.0
        self.metrics[ROLE_METRICS[CALLER]] = 1.0 if correct else 0.0
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
        self.rewards[REPORTER] = 1.0 if faithful else 0.0
        self.metrics[ROLE_METRICS[REPORTER]] = 1.0 if faithful else 0.0
        self.success = _close(self.final_answer, self.task.answer)
        self._turn, self.done = None, True


def eval_tasks() -> list[TeamCalculator]:
    """The fixed held-out set: 64 distinct questions from a constant seed."""
    return held_out_questions(TeamCalculator, "team_calculator-eval-v1")


def train_tasks(seed: int) -> Iterator[TeamCalculator]:
    """Endless seeded stream of training questions, skipping every eval question."""
    return training_questions(TeamCalculator, seed, eval_tasks())


def tool_call(expression: str) -> Message:
    """The caller's reply calling the calculator on `expression` (OpenAI format)."""
    arguments = json.dumps({"expression": expression})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        ],
    }


def oracle(task: TeamCalculator, turn: Turn) -> Message:
    """A correct reply for either role: the exact expression, or the tool's result copied."""
    if turn.role == CALLER:
        return tool_call(task.expression)
    result = str(turn.messages[-1]["content"]).rsplit("Calculator result: ", 1)[-1]
    return {"role": "assistant", "content": result}


# Demonstration noise, tuned so that each warm-started model scores about half on its own metric
# offline (`swarmrl bootstrap-model --sources team_calculator.<role> --eval 128`): right format,
# room for RL. Nominal rates are caller 0.6 * 0.9 = 54%, reporter 0.65 * 0.85 = 55%; measured
# (seed 0, default steps): caller on `tiny` 54%, reporter on `tiny-llama` 47%.
CALLER_NOISE = {"p_guess": 0.4, "p_mistype": 0.1}
REPORTER_NOISE = {"p_guess": 0.35, "p_mistype": 0.15}


def role_demonstrations(
    task: TeamCalculator,
    rng: random.Random,
    caller: dict[str, float] = CALLER_NOISE,
    reporter: dict[str, float] = REPORTER_NOISE,
) -> dict[str, list[Message]]:
    """Per role, a conversation ending in that role's (noisy) reply.

    Caller: with probability `p_guess` a text guess instead of a call, else a call whose expression
    has a mistyped digit with probability `p_mistype`. Reporter: it sees the result of the caller's
    demonstrated call (or of a correct call when the caller guessed: SFT wants a reporter example
    for every question), then guesses with probability `p_guess`, else copies the result, mistyping
    a digit with probability `p_mistype`.
    """
    env = TeamCalculatorEnv(task)
    turn = env.turn()
    assert turn is not None
    if rng.random() < caller["p_guess"]:
        reply: Message = {"role": "assistant", "content": str(rng.randint(10, 99))}
    else:
        mistyped = rng.random() < caller["p_mistype"]
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
    if rng.random() < reporter["p_guess"]:
        answer = str(rng.randint(10, 99))
    else:
        answer = _mistype(result, rng) if rng.random() < reporter["p_mistype"] else result
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
    # Default warm starts (`presets.default_steps`): caller 250 rounds x 2 views x 2 = 1000 steps, the
    # reporter 750. Copying the expression was learned by step 1000 but not always by step 500 (6%
    # valid calls: right format, wrong digits); the reporter's 250 steps gave 9%, 750 reach its demos.
    role_sft_weights={CALLER: 2, REPORTER: 3},
    role_oracle=oracle,
)
