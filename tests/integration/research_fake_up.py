"""A stand-in for `swarmrl up` in research tests (`swarmrl research --up-command`): no swarm, seconds.

It takes up's flags, records its pid like `up` (`up.pid`), writes an `evals` ledger table whose
success curve is known from `--lr` and `--seed` (success = 0.3 + 1000 * lr * step / 10 + 0.01 * seed
at steps 0, 5, 10), and ends with up's last line. `FAKE_UP_SECONDS` (default 0.3) is how long it
"trains"; SIGTERM ends it early as `interrupted`, as up does. `FAKE_UP_FAIL_LR` makes runs with that
learning rate crash (exit 1, no last line). `FAKE_UP_LOG` appends one line per run that got to its
end or was interrupted: run dir, seed, and with a shared server (`$SWARMRL_NATS`) how many messages
its METRICS stream held after it published one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def curve(lr: float, seed: int) -> list[tuple[int, float]]:
    return [(step, 0.3 + 1000 * lr * step / 10 + 0.01 * seed) for step in (0, 5, 10)]


async def use_nats(seconds: float) -> int:
    """With a shared server (`SWARMRL_NATS` = the run's account): create the swarm's streams, publish
    one metric, stay `seconds`, then count the METRICS stream (1 unless another run's message got in)."""
    from swarmrl.schemas import subjects as S
    from swarmrl.services.common import bus

    nc = await bus.connect(os.environ["SWARMRL_NATS"], "fake-up")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    await js.publish(f"{S.METRICS_PREFIX}.fake", b"1")
    await asyncio.sleep(seconds)
    count = (await js.stream_info(S.METRICS_STREAM)).state.messages
    await nc.close()
    return int(count)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--minutes", type=float, default=1)
    args, _ = p.parse_known_args()
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "up.pid").write_text(f"{os.getpid()}\n")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    seconds = float(os.environ.get("FAKE_UP_SECONDS", "0.3"))
    seen = asyncio.run(use_nats(seconds)) if os.environ.get("SWARMRL_NATS") else 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop:
        print(
            f"[{int(time.monotonic() % 1000)}s] step 3/10 | eval success calculator 30%→40% (v5)", flush=True
        )
        time.sleep(0.05)
    if log := os.environ.get("FAKE_UP_LOG"):
        with open(log, "a") as f:
            f.write(f"{run_dir.name} {args.seed} metrics={seen}\n")
    if stop:
        print("swarmrl up: stopped (interrupted). Report: x", flush=True)
        return 0
    if os.environ.get("FAKE_UP_FAIL_LR") and float(os.environ["FAKE_UP_FAIL_LR"]) == args.lr:
        print("boom", flush=True)
        return 1
    pts = curve(args.lr, args.seed)
    table = pa.table(
        {
            "model": ["policy"] * 3, "step": [s for s, _ in pts], "task": ["calculator"] * 3,
            "success_rate": [y for _, y in pts], "n": [128] * 3, "temperature": [1.0] * 3,
            "metric": ["success"] * 3, "ts": [time.time()] * 3,
        }
    )  # fmt: skip
    (run_dir / "ledger" / "evals").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run_dir / "ledger" / "evals" / "part-0-n1.parquet")
    (run_dir / "up.pid").unlink()
    print(
        f"swarmrl up: stopped (time budget of {args.minutes:g} min spent at policy step 10). Report: x",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
