"""Where a decode step of a ~0.5B model goes on a GPU: attention kernels and the sampler.

    python bench/gpu_attention.py [--out bench/results]

The model of `bench/gpu.py` (Qwen2.5-0.5B's shape, random initialisation, bf16) decodes 48 steps
after a 128-token prompt through plain HF forwards with a `DynamicCache` and a growing attention
mask, as the embedded engine feeds it, with each step timed between CUDA synchronisations. Per
attention implementation (`sdpa` with torch's default kernel choice, `sdpa` without cuDNN's kernel,
`eager`) and batch size: the first steps and the median step (from the ninth), on a first pass
and again over the same shapes. Then the engine's sampler on [64, 151936] logits on the CPU and on
the GPU. Prints its lines and writes them to gpu-attention.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from benchutil import RESULTS

LINES: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    LINES.append(line)


def loop(model, batch: int, steps: int, label: str, kernels: AbstractContextManager[object]) -> None:  # type: ignore[no-untyped-def]
    import torch
    from transformers import DynamicCache

    from swarmrl.services.engine.kv_batch import cache_argument

    arg = cache_argument(model)  # `cache` in the transformers that deprecate `past_key_values`
    ids = torch.randint(10, 700, (batch, 128), device="cuda")
    mask = torch.ones_like(ids)
    cache = DynamicCache()
    with torch.inference_mode(), kernels:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **{arg: cache})
        last = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for s in range(steps):
            torch.cuda.synchronize()
            started = time.perf_counter()
            mask = torch.cat([mask, mask.new_ones(batch, 1)], 1)
            pos = torch.full((batch, 1), 128 + s, device="cuda")
            out = model(input_ids=last, attention_mask=mask, position_ids=pos, use_cache=True, **{arg: cache})
            last = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - started) * 1000)
    first = [round(x, 1) for x in times[:4]]
    say(f"{label:36} batch {batch:3}: first steps {first} ms, median {statistics.median(times[8:]):.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS, help="where gpu-attention.md goes")
    args = p.parse_args()
    import gpu
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoModelForCausalLM

    from swarmrl.services.engine.sampling import SamplingParams, sample

    tmp = Path(tempfile.mkdtemp())
    gpu.build(tmp / "m", 24, 151936)
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; cuDNN attention enabled: "
        f"{torch.backends.cuda.cudnn_sdp_enabled()}")  # fmt: skip
    no_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    for attn in ("sdpa", "eager"):
        model = AutoModelForCausalLM.from_pretrained(
            tmp / "m", dtype=torch.bfloat16, attn_implementation=attn
        )
        model = model.cuda().eval()  # type: ignore[call-arg]  # transformers types .cuda() oddly
        for batch, label in ((1, "first pass"), (1, "same shapes again"), (16, "first pass"), (64, "first pass"),
                             (64, "same shapes again")):  # fmt: skip
            loop(model, batch, 48, f"{attn}, {label}", nullcontext())
        if attn == "sdpa":
            loop(model, 1, 48, "sdpa without cuDNN, first pass", sdpa_kernel(no_cudnn))
            loop(model, 1, 48, "sdpa without cuDNN, again", sdpa_kernel(no_cudnn))
        del model
        torch.cuda.empty_cache()
    params = [SamplingParams(temperature=1.0, max_new_tokens=1)] * 64
    for dev in ("cpu", "cuda"):
        logits = torch.randn(64, 151936, device="cuda")
        g = torch.Generator(dev).manual_seed(0)
        sample(logits.to(dev), params, [None] * 64, g)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(5):
            sample(logits.to(dev), params, [None] * 64, g)
        say(f"sample [64, 151936] on {dev}: {(time.perf_counter() - started) / 5 * 1000:.1f} ms")
    (args.out / "gpu-attention.md").write_text(
        "# A decode step on the GPU: attention kernels and the sampler\n\n"
        "Written by `python bench/gpu_attention.py` (see its docstring).\n\n```\n"
        + "\n".join(LINES)
        + "\n```\n"
    )
    print(f"wrote {args.out / 'gpu-attention.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
