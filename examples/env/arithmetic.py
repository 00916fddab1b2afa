"""A multi-turn environment of your own, with a tool: arithmetic with a second try.

The model is asked "What is 7 * 4 + 8?". It may call `calculator` (a plain function: its type hints
and docstring become the tool spec the model sees) and then answers. A wrong answer gets one more
try, with a hint: reward 1 for a right first answer, 0.5 for a right second one, else 0.

swarmrl plays it with its built-in runner (`env = "arithmetic.py:Arithmetic"` in swarm.toml). With
`sandbox = true` the tool calls run as python actions in the actions service's sandbox: this file,
run as a program, which is why it imports only the standard library.

The prompt, the tool's name and its spec are the ones the bootstrap model's warm start saw (the
built-in calculator task), so the tiny CPU model starts from somewhere; a real chat model needs no
such care.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Iterator

SYSTEM = "You are a careful assistant. Use the calculator tool, then reply with the final number only."
HINT = "That is not right. Use the calculator, then reply with the final number only."
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: for example 37 * 12 + 5
    """

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only whole numbers with + - * and parentheses")

    if len(expression) > 100:
        raise ValueError("expression too long")
    return str(value(ast.parse(expression, mode="eval").body))


def _question(rng: random.Random) -> dict:
    """One-digit operands, a two-digit answer (what the warm start covered)."""
    while True:
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
        o1, o2 = rng.choice("+-*"), rng.choice("+-*")
        expression = f"{a} {o1} {b} {o2} {c}"
        answer = int(calculator(expression))
        if 10 <= answer <= 99:
            return {
                "task_id": f"arithmetic/{expression.replace(' ', '')}",
                "expression": expression,
                "answer": answer,
            }


class Arithmetic:
    tools = [calculator]

    def __init__(self, instance: dict) -> None:
        self.expression, self.answer = instance["expression"], int(instance["answer"])
        self.tries = 0
        self.reward, self.success = 0.0, False

    def reset(self) -> list[dict]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {self.expression}?"},
        ]

    def step(self, reply: dict) -> tuple[list[dict], bool]:
        """A reply without tool calls is an answer: the last number in it."""
        self.tries += 1
        numbers = re.findall(r"-?\d+", reply.get("content") or "")
        if numbers and int(numbers[-1]) == self.answer:
            self.success, self.reward = True, 1.0 if self.tries == 1 else 0.5
            return [], True
        if self.tries == 2:
            return [], True
        return [{"role": "user", "content": HINT}], False

    @staticmethod
    def eval_instances() -> list[dict]:
        """64 distinct questions from a fixed seed: the same held-out set on every machine."""
        rng, seen = random.Random("arithmetic-eval-v1"), {}
        while len(seen) < 64:
            q = _question(rng)
            seen.setdefault(q["task_id"], q)
        return list(seen.values())

    @staticmethod
    def train_instances(seed: int) -> Iterator[dict]:
        held_out = {q["task_id"] for q in Arithmetic.eval_instances()}
        rng = random.Random(seed)
        while True:
            q = _question(rng)
            if q["task_id"] not in held_out:
                yield q
