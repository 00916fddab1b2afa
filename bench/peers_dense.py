"""Score a run's checkpoints more densely than `bench/peers.py`'s one a minute.

`python bench/peers_dense.py DIR LO HI STRIDE` scores `DIR/step-N` for N in LO, LO+STRIDE, ... HI
(the ones that exist) with `bench/peers.py`'s evaluation (`evaluate_dir`: the held-out questions,
seeded, the same draws for every checkpoint) and prints `vN success n` a line. `bench/peers.py`
keeps only the checkpoints it evaluates: hard-link the others aside while the run goes
(`cp -al`) to score them.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from peers import evaluate_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, help="a folder of step-N checkpoints")
    p.add_argument("lo", type=int)
    p.add_argument("hi", type=int)
    p.add_argument("stride", type=int, nargs="?", default=1)
    a = p.parse_args()
    if a.stride < 1 or a.lo > a.hi:
        p.error("want LO <= HI and STRIDE >= 1")
    found = [a.dir / f"step-{v}" for v in range(a.lo, a.hi + 1, a.stride) if (a.dir / f"step-{v}").is_dir()]
    if not found:
        raise SystemExit(f"no step-N checkpoint in {a.dir} between {a.lo} and {a.hi}")
    for path in found:
        success, n = asyncio.run(evaluate_dir(path))
        print(f"v{path.name.removeprefix('step-')} {success:.1%} {n}", flush=True)


if __name__ == "__main__":
    main()
