"""Where the GPU checks run, and the tolerances they compare CUDA with the CPU by.

`SWARMRL_GPU_TEST_DEVICE` (default `cuda`) names the device under test. `cpu` dry-runs every
check on a machine without a GPU: the CUDA side is then the CPU too, so the comparisons are
trivially close, but every code path, fixture and subprocess runs as it will on the GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("SWARMRL_GPU_TEST_DEVICE", "cuda")
"""The torch device under test (`cuda`, `cuda:1`, or `cpu` for a dry run)."""

DEVICE_TYPE = torch.device(DEVICE).type

needs_device = pytest.mark.skipif(
    DEVICE_TYPE == "cuda" and not torch.cuda.is_available(),
    reason=f"no CUDA device for {DEVICE} (SWARMRL_GPU_TEST_DEVICE=cpu dry-runs these checks on the CPU)",
)

# fp32 on CUDA and on the CPU differ by summation order only (TF32 is off for matmuls by default):
# logits agree to ~1e-6, logprobs to ~1e-5. A wrong mask, position or device mix-up moves them by
# 1e-2 or more.
LOGPROB_ATOL = 1e-4
NEAR_TIE = 1e-3
"""Greedy picks may differ between devices only where the top two logits are closer than this."""
