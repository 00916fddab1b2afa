"""A tool task for SmolLM2-135M-Instruct: two-digit products, which it cannot work out itself, with a
`multiply` tool that can.

SmolLM2's chat template drops `tools`, so the gateway writes the tool into the system message in
Hermes' `<tool_call>` convention (`[gateway] tool_prompt`, `auto`) and parses the model's calls in it.
A reply without a tool call is the answer: reward 1 when its last number is the product. The
tool's spec (name, arguments, description) comes from its type hints and docstring.

Plays with the built-in runner (`env = "tools.py:Products"` in `tools.toml`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

SYSTEM = "Use the multiply tool to work out products. Then reply with the number only."


def multiply(a: int, b: int) -> str:
    """Multiply two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return str(int(a) * int(b))


def _question(rng: random.Random) -> dict:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    return {"task_id": f"products/{a}x{b}", "a": a, "b": b}


class Products:
    tools = [multiply]

    def __init__(self, instance: dict) -> None:
        self.a, self.b = int(instance["a"]), int(instance["b"])
        self.reward, self.success = 0.0, False

    def reset(self) -> list[dict]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {self.a} times {self.b}?"},
        ]

    def step(self, reply: dict) -> tuple[list[dict], bool]:
        numbers = re.findall(r"-?\d+", reply.get("content") or "")
        self.success = bool(numbers) and int(numbers[-1]) == self.a * self.b
        self.reward = 1.0 if self.success else 0.0
        return [], True

    @staticmethod
    def eval_instances() -> list[dict]:
        """64 distinct questions from a fixed seed: the same held-out set everywhere."""
        rng, seen = random.Random("products-eval-v1"), {}
        while len(seen) < 64:
            q = _question(rng)
            seen.setdefault(q["task_id"], q)
        return list(seen.values())

    @staticmethod
    def train_instances(seed: int) -> Iterator[dict]:
        held_out = {q["task_id"] for q in Products.eval_instances()}
        rng = random.Random(seed)
        while True:
            q = _question(rng)
            if q["task_id"] not in held_out:
                yield q
