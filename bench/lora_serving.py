"""What serving LoRA adapters costs the embedded engine: decode throughput with none, one, and two
adapters mixed in each batch, on the same model.

    python bench/lora_serving.py [--rounds 3] [--rank 16] [--out bench/results]

16 concurrent requests (48-token prompts, 64 new tokens at temperature 1, ignore_eos) on the bootstrap
`tiny` model (random init; the cost does not depend on the weights), 2 torch threads. Cases: the
plain engine; the engine with peft's wrapper serving base rows; every row on one adapter; rows
alternating between two adapters (peft's mixed-adapter forward splits each LoRA layer by adapter).
Generated tokens/s, the best of `--rounds`. Writes `lora-serving.{json,md}`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchutil import RESULTS, machine, write_json

from swarmrl.machine import describe
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.sampling import SamplingParams
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import load_trainable

PARAMS = SamplingParams(max_new_tokens=64, temperature=1.0, ignore_eos=True)
CASES = {"no adapters (plain engine)": None, "peft wrapper, base rows": [None],
         "one adapter": ["red"], "two adapters, mixed": ["red", "blue"]}  # fmt: skip


def tokens_per_s(engine: EngineCore, adapters: list[str | None], rounds: int) -> float:
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        futures = [
            engine.submit([5 + i] * 48, PARAMS, adapter=adapters[i % len(adapters)]) for i in range(16)
        ]
        n = sum(len(f.result().output_ids) for f in futures)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    from swarmrl.bootstrap import build_model

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lora-serving-") as tmp:
        base, adapter = Path(tmp) / "tiny", Path(tmp) / "adapter"
        build_model(base, seed=0, warm_start_steps=0, progress=False)
        lora = load_trainable(TrainerConfig(model_path=str(base), lora_rank=args.rank), base)  # the trainer's
        lora.save_pretrained(adapter)
        for case, adapters in CASES.items():
            engine = EngineCore(base, max_batch=16, adapters=["red", "blue"] if adapters else ())
            try:
                if adapters and adapters != [None]:
                    for name in ("red", "blue"):
                        assert engine.load_lora_adapter(name, str(adapter))[0]
                elif adapters == [None]:  # wrap the base without using an adapter
                    assert engine.load_lora_adapter("red", str(adapter))[0]
                rows.append(
                    {"case": case, "tokens_per_s": tokens_per_s(engine, adapters or [None], args.rounds)}
                )
            finally:
                engine.close()
            print(rows[-1], file=sys.stderr)
    result = {"machine": machine(), "rank": args.rank, "rounds": args.rounds, "rows": rows}
    write_json("lora-serving", result, args.out)
    plain = rows[0]["tokens_per_s"]
    lines = [
        "# Serving LoRA adapters: decode throughput of the embedded engine",
        "",
        f"Machine: {describe(result['machine'])}; {result['machine']['date']}. Command: `python "
        f"bench/lora_serving.py --rounds {args.rounds} --rank {args.rank}`. 16 concurrent requests, 64 new "
        "tokens each, on the bootstrap `tiny` model (1.8M parameters) with rank-"
        f"{args.rank} adapters on every linear layer; best of {args.rounds}.",
        "",
        "| case | tokens/s | vs plain |",
        "| --- | ---: | ---: |",
        *(f"| {r['case']} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / plain:.2f}x |" for r in rows),
        "",
        "A rank-r adapter adds 2r/width of a square layer's multiply-adds (17% at this model's width 192, "
        "0.8% at a 7B's 4096), so most of the cost measured here is the extra small operations per layer "
        "(the adapter's two matmuls, peft's split by adapter, dispatch), which do not grow with the model; "
        "this table is the tiny model's, not a large one's.",
    ]
    path = args.out / "lora-serving.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
