"""Write problems.jsonl: arithmetic word problems with numeric answers (the dataset example's data).

    python examples/dataset/make_data.py [--rows 2400] [--seed 0] [--out examples/dataset/problems.jsonl]

Each row: {"question": "...", "answer": 12, "kind": "add"}. Numbers are small (sums up to 12: sized for the 1.8M-parameter bootstrap model),
the wording varies (names, things, verbs), so a model has to read the words to get the numbers and
the operation.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Cleo", "Dev", "Ema", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena", "Milo",
         "Nora", "Omar", "Pia", "Quin", "Rosa", "Sam", "Tara", "Uma", "Vic", "Wes", "Yara", "Zoe"]  # fmt: skip
THINGS = ["apples", "pens", "cards", "marbles", "books", "shells", "coins", "stamps", "cookies", "stickers",
          "rocks", "eggs", "cups", "hats", "keys", "boats"]  # fmt: skip
ADD = [
    "{n} has {a} {t}. {n} gets {b} more. How many {t} does {n} have now?",
    "{n} found {a} {t} and then found {b} more. How many {t} did {n} find in all?",
    "There are {a} {t} in a box and {b} {t} on the table. How many {t} are there?",
    "{n} bought {a} {t} on Monday and {b} {t} on Tuesday. How many {t} did {n} buy?",
]
SUB = [
    "{n} had {a} {t} and gave {b} away. How many {t} are left?",
    "There were {a} {t}. {n} took {b} of them. How many {t} remain?",
    "{n} has {a} {t} and loses {b}. How many {t} does {n} have now?",
    "{a} {t} were on a shelf. {b} fell off. How many {t} are still on the shelf?",
]


def problem(rng: random.Random) -> dict[str, object]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    if rng.random() < 0.5:
        a, b = rng.randint(1, 6), rng.randint(1, 6)
        return {"question": rng.choice(ADD).format(n=name, t=thing, a=a, b=b), "answer": a + b, "kind": "add"}
    a = rng.randint(2, 12)
    b = rng.randint(1, a - 1)
    return {"question": rng.choice(SUB).format(n=name, t=thing, a=a, b=b), "answer": a - b, "kind": "sub"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("problems.jsonl"))
    args = p.parse_args()
    rng = random.Random(args.seed)
    with args.out.open("w") as f:
        for _ in range(args.rows):
            f.write(json.dumps(problem(rng)) + "\n")
    print(f"wrote {args.rows} problems to {args.out}")


if __name__ == "__main__":
    main()
