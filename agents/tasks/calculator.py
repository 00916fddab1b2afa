"""`calculator`: tool use. Asked "What is 7 * 4 + 8?", the model should call
`calculator(expression)`, then reply with the number the `tool` message gave. A reply without tool
calls is the final answer (its last number): reward 1 when right, else 0 (also after `max_turns`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from swarmrl.agents.tasks import arith
from swarmrl.agents.tasks.arith import ExpressionError, Number, format_number, safe_eval
from swarmrl.agents.tasks.base import Message, StepResult, TaskSpec, TurnEnv, message_text

SYSTEM_PROMPT = "You are a careful assistant. Use the calculator tool, then reply with the final number only."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "for example 37 * 12 + 5"}},
                "required": ["expression"],
            },
        },
    }
]


_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")
_OPS = ("+", "-", "*")


@dataclass(frozen=True)
class Question:
    """One arithmetic question; `task_id` is `<task>/<expression without spaces>`."""

    expression: str
    prefix: ClassVar[str] = "calculator"

    @property
    def task_id(self) -> str:
        return f"{self.prefix}/" + self.expression.replace(" ", "")

    @property
    def answer(self) -> Number:
        return safe_eval(self.expression)

    def question(self) -> str:
        return f"What is {self.expression}?"

    @classmethod
    def held_out(cls) -> list[Self]:
        """The fixed held-out set: 64 questions, distinct by `task_id`, from a constant seed."""
        rng = random.Random(f"{cls.prefix}-eval-v1")
        seen: dict[str, Self] = {}
        while len(seen) < 64:
            task = cls(_random_expression(rng))
            seen.setdefault(task.task_id, task)
        return list(seen.values())

    @classmethod
    def training(cls, seed: int) -> Iterator[Self]:
        """Endless seeded stream of training questions, skipping every held-out one."""
        skip = {task.task_id for task in cls.held_out()}
        rng = random.Random(seed)
        while True:
            task = cls(_random_expression(rng))
            if task.task_id not in skip:
                yield task


@dataclass(frozen=True)
class Calculator(Question):
    max_turns: int = 3

    def user_prompt(self) -> str:
        return self.question()


@dataclass(frozen=True)
class CalculatorReply:
    """A parsed assistant message: per tool call its expression (None: malformed), or the answer."""

    expressions: tuple[str | None, ...] = ()
    answer: float | None = None


def _call_expression(call: dict[str, Any]) -> str | None:
    function = call.get("function", call)  # tolerate flattened {"name", "arguments"} calls
    if function.get("name") != "calculator":
        return None
    arguments = function.get("arguments")
    if isinstance(arguments, str):  # OpenAI sends a JSON string; some clients send a dict
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    expression = arguments.get("expression") if isinstance(arguments, dict) else None
    return expression if isinstance(expression, str) else None


def parse_reply(reply: Message) -> CalculatorReply:
    """Parse an assistant message (OpenAI format) into tool-call expressions or a final answer."""
    calls = reply.get("tool_calls") or []
    if calls:
        return CalculatorReply(expressions=tuple(_call_expression(c) for c in calls))
    numbers = _NUMBER_RE.findall(_THOUSANDS_RE.sub("", message_text(reply)))
    return CalculatorReply(answer=float(numbers[-1]) if numbers else None)


# The tool as a sandbox program: the evaluator's own source and a main reading the expression from
# stdin (data, never spliced into the code), so it answers exactly what `_run_tool` does.
TOOL_PROGRAM = (
    Path(arith.__file__).read_text()
    + """

if __name__ == "__main__":
    import sys

    try:
        print(format_number(safe_eval(sys.stdin.read())))
    except ExpressionError as e:
        print(f"error: {e}")
"""
)


def tool_actions(reply: Message) -> list[dict[str, Any] | None]:
    """Per tool call of `reply`, the python action computing its result (None: a malformed call)."""
    return [None if e is None else {"code": TOOL_PROGRAM, "stdin": e} for e in parse_reply(reply).expressions]


class CalculatorEnv(TurnEnv):
    system_prompt = SYSTEM_PROMPT
    task: Calculator

    def step(self, reply: Message, tool_results: list[str | None] | None = None) -> StepResult:
        """`tool_results`: the tool calls' results from the sandbox (None: computed here)."""
        self._next_turn()
        parsed = parse_reply(reply)
        if parsed.expressions:
            given = tool_results or [None] * len(parsed.expressions)
            results = [
                r if r is not None else self._run_tool(e)
                for e, r in zip(parsed.expressions, given, strict=True)
            ]
            calls = reply.get("tool_calls") or []
            messages: list[Message] = [
                {"role": "tool", "tool_call_id": call.get("id") or f"call_{i}", "content": result}
                for i, (call, result) in enumerate(zip(calls, results, strict=True))
            ]
            self.done = self.turns >= self.task.max_turns
            return StepResult(messages, self.done, {"tool_results": results, "turn": self.turns})
        self.success = parsed.answer is not None and abs(parsed.answer - self.task.answer) < 1e-6
        self.reward = 1.0 if self.success else 0.0
        self.done = True
        return StepResult([], True, {"answer": parsed.answer, "turn": self.turns})

    @staticmethod
    def _run_tool(expression: str | None) -> str:
        if expression is None:
            return 'error: call calculator with {"expression": "<arithmetic>"}'
        try:
            return format_number(safe_eval(expression))
        except ExpressionError as e:
            return f"error: {e}"


def _random_expression(rng: random.Random) -> str:
    # One-digit operands and two-digit answers: every expression and result has the same token
    # length, which keeps the copying within reach of a tiny model's short warm start.
    while True:
        o1, o2 = rng.choice(_OPS), rng.choice(_OPS)
        expression = f"{rng.randint(2, 9)} {o1} {rng.randint(2, 9)} {o2} {rng.randint(2, 9)}"
        if 10 <= safe_eval(expression) <= 99:
            return expression


eval_tasks = Calculator.held_out
train_tasks = Calculator.training


def tool_call(expression: str) -> Message:
    """The assistant reply calling the calculator on `expression`."""
    arguments = json.dumps({"expression": expression})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        ],
    }


def _mistype(text: str, rng: random.Random) -> str:
    """Change one digit of `text` (a copy mistake)."""
    positions = [i for i, ch in enumerate(text) if ch.isdigit()]
    i = rng.choice(positions)
    # no new leading zero: "07" is not a Python literal
    leading = (i == 0 or not text[i - 1].isdigit()) and i + 1 < len(text) and text[i + 1].isdigit()
    digit = rng.choice([d for d in "0123456789" if d != text[i] and not (leading and d == "0")])
    return text[:i] + digit + text[i + 1 :]


NOISE = {"p_no_tool": 0.5, "p_bad_expression": 0.1, "p_bad_copy": 0.1}


def demonstration(task: Calculator, rng: random.Random) -> list[Message]:
    """A demonstration right only some of the time, leaving RL room: with `p_no_tool` a guess at
    once, else a tool call and the result copied, a digit mistyped now and then (`NOISE`)."""
    env = CalculatorEnv(task)
    messages = env.reset()
    if rng.random() < NOISE["p_no_tool"]:
        guess: Message = {"role": "assistant", "content": str(rng.randint(10, 99))}
        messages.append(guess)
        env.step(guess)
        return messages
    expression = (
        _mistype(task.expression, rng) if rng.random() < NOISE["p_bad_expression"] else task.expression
    )
    call = tool_call(expression)
    messages.append(call)
    step = env.step(call)
    messages += step.messages
    result = step.messages[0]["content"]
    answer = _mistype(result, rng) if rng.random() < NOISE["p_bad_copy"] else result
    final: Message = {"role": "assistant", "content": answer}
    messages.append(final)
    env.step(final)
    return messages


SPEC = TaskSpec(
    name="calculator",
    make_env=CalculatorEnv,
    train_tasks=train_tasks,
    eval_tasks=eval_tasks,
    demonstration=demonstration,
    parse_reply=parse_reply,
    tools=TOOLS,
    tool_actions=tool_actions,
    sft_weight=2,  # copying the question into the call and the result into the answer is slow to learn
)
