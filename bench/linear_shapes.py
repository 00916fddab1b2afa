"""SmolLM2-135M's linear layers at decode heights on this CPU: three public ways to run them.

    python bench/linear_shapes.py [--threads 2]

For each weight shape of the model (576 -> 1536, 1536 -> 576, the 576 -> 49,152 output layer), in
bf16 and fp32, at 1, 16 and 64 rows: `F.linear` (what nn.Linear runs), `x @ W^T` with the weight
transposed once beforehand, and `torch.utils.mkldnn`'s packed linear. Milliseconds per call (mean of
50 after 5) and GFLOP/s. Quoted in `bench/results/real-model.md` ("Where a decode step goes").
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils import mkldnn

SHAPES = ((576, 1536), (1536, 576), (576, 49152))


def per_call_ms(fn: Callable[..., object], *args: torch.Tensor, n: int = 50) -> float:
    for _ in range(5):
        fn(*args)
    t = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    torch.set_num_threads(p.parse_args().threads)
    for dtype in (torch.bfloat16, torch.float32):
        for n_in, n_out in SHAPES:
            w = torch.randn(n_out, n_in, dtype=dtype)
            wt = w.t().contiguous()
            packed = mkldnn.to_mkldnn(torch.nn.Linear(n_in, n_out, bias=False), dtype=dtype)
            for rows in (1, 16, 64):
                x = torch.randn(rows, n_in, dtype=dtype)
                flops = 2 * rows * n_in * n_out
                with torch.inference_mode():
                    times = {
                        "F.linear": per_call_ms(F.linear, x, w),
                        "x @ W^T": per_call_ms(torch.matmul, x, wt),
                        "mkldnn": per_call_ms(packed, x),
                    }
                cells = ", ".join(f"{k} {ms:.3f} ms ({flops / ms / 1e6:.0f} GF/s)" for k, ms in times.items())
                print(f"{str(dtype).removeprefix('torch.')} {n_in}x{n_out} rows={rows}: {cells}", flush=True)


if __name__ == "__main__":
    main()
