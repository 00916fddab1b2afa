"""Write numbers.jsonl: which of two numbers is larger or smaller (the SmolLM2 example's data).

    python examples/smollm/make_data.py [--rows 4000] [--seed 0] [--out examples/smollm/numbers.jsonl]

Each row: {"messages": [...], "answer": 52, "kind": "larger"}. The opening messages are the same three
worked examples for every row, then the question, so every prompt shares one prefix (the engine's
prefix cache and the trainer's prefix trees compute it once). The numbers have two or three digits.
Measured on SmolLM2-135M-Instruct at temperature 1 (`bench/results/up/smollm-30min.md`), the model
answers with a number after these examples and picks the right one about half the time: RL has to
teach it to compare.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM = "Answer with the number only."
SHOTS = [
    ("Which is larger, 14 or 41?", "41"),
    ("Which is smaller, 63 or 36?", "36"),
    ("Which is larger, 80 or 79?", "80"),
]


def row(rng: random.Random) -> dict[str, object]:
    digits = rng.choice((2, 3))
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    a, b = rng.sample(range(lo, hi + 1), 2)
    kind = rng.choice(("larger", "smaller"))
    answer = max(a, b) if kind == "larger" else min(a, b)
    messages = [{"role": "system", "content": SYSTEM}]
    for question, reply in SHOTS:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": f"Which is {kind}, {a} or {b}?"})
    return {"messages": messages, "answer": answer, "kind": kind}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("numbers.jsonl"))
    args = p.parse_args()
    rng = random.Random(args.seed)
    with args.out.open("w") as f:
        for _ in range(args.rows):
            f.write(json.dumps(row(rng)) + "\n")
    print(f"wrote {args.rows} rows to {args.out}")


if __name__ == "__main__":
    main()
