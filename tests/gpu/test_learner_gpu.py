"""The trainer's learner on the GPU: the same GRPO steps from the same samples as on the CPU, the
prefix-shared (tree attention) and packed layouts agreeing there, a LoRA adapter's steps matching the
CPU's, and a bf16 mixed-precision step.

Each (device, precision) trains in its own process (`learner_runs.py`: Accelerate's state is
process-wide); the three run at once and the tests compare what they wrote.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.gpu.device import DEVICE, LOGPROB_ATOL, needs_device

pytestmark = [pytest.mark.gpu, needs_device]

ROOT = Path(__file__).resolve().parents[2]
RUNS = {  # name -> (device, mixed precision, layouts)
    "cpu": ("cpu", "no", ["shared", "shared-lora"]),
    "gpu": (DEVICE, "no", ["shared", "packed", "shared-lora"]),
    "bf16": (DEVICE, "bf16", ["shared"]),
}
LR = 1e-3
# Adam's first steps move each weight by about lr whatever its gradient's size; a weight whose
# gradient is within float error of 0 may move differently on two devices, by a fraction of lr.
# A wrong gradient moves many weights by a whole lr. (CPU, shared against packed: 2.5e-5.)
WEIGHT_ATOL = 0.25 * LR


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every run's output folder, once all three have finished."""
    root = tmp_path_factory.mktemp("learner-runs")
    procs = {}
    for name, (device, precision, layouts) in RUNS.items():
        env = dict(os.environ)
        if device == "cpu":  # the CPU reference, on a machine that has a GPU too
            env["ACCELERATE_USE_CPU"] = "true"
        args = [sys.executable, "-m", "tests.learner_runs", str(tiny_model_dir), str(root / name)]
        procs[name] = subprocess.Popen(
            [*args, device, precision, *layouts], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"{name} run failed:\n{output[-4000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {name: root / name for name in RUNS}


def result(runs: dict[str, Path], name: str) -> dict:
    return json.loads((runs[name] / "result.json").read_text())


def weights(runs: dict[str, Path], name: str, layout: str) -> dict[str, torch.Tensor]:
    return load_file(str(runs[name] / f"{layout}.safetensors"))


def assert_logprobs_close(a: dict[str, list[float]], b: dict[str, list[float]], atol: float) -> None:
    assert sorted(a) == sorted(b)
    for sid in a:
        torch.testing.assert_close(
            torch.tensor(a[sid]),
            torch.tensor(b[sid]),
            atol=atol,
            rtol=0,
            msg=lambda m, sid=sid: f"{sid}: {m}",
        )


def assert_same_steps(a: list[dict[str, float]], b: list[dict[str, float]]) -> None:
    """The same statistics step by step. The first step starts from the same weights (float error
    only); later ones from weights that differ by float error, which can move a token across the
    clip boundary (one token is 1/66 of clip_frac)."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in ("trained_tokens", "tokens", "updates", "skipped_updates"):
            assert x[key] == y[key], (i, key)
        first = i == 0
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4 if first else 0, abs=1e-6 if first else 1e-3), i
        assert x["clip_frac"] == pytest.approx(y["clip_frac"], abs=0.02 if first else 0.05), i
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-3 if first else 1e-2), i
        assert x["skipped_updates"] == 0 and x["grad_norm"] > 0


def assert_same_update(
    start: dict[str, torch.Tensor], a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
) -> None:
    """Both runs moved every weight alike: within `WEIGHT_ATOL`, and in the same direction overall."""
    assert sorted(a) == sorted(b)
    moved = 0
    for name in a:
        diff = (a[name] - b[name]).abs().max().item()
        assert diff <= WEIGHT_ATOL, f"{name}: weights differ by {diff:.2e} after the same steps"
        da, db = (a[name] - start[name]).flatten(), (b[name] - start[name]).flatten()
        if da.norm() > 0 or db.norm() > 0:
            moved += 1
            cos = torch.nn.functional.cosine_similarity(da, db, dim=0).item()
            assert cos > 0.999, f"{name}: the updates point apart (cosine {cos:.5f})"
    assert moved > len(a) // 2, f"only {moved} of {len(a)} tensors changed"


@pytest.fixture(scope="module")
def start(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_runs_ran_where_asked(runs: dict[str, Path]) -> None:
    for name, (device, precision, layouts) in RUNS.items():
        res = result(runs, name)
        assert sorted(res) == sorted(layouts)
        for layout in layouts:
            assert torch.device(res[layout]["device"]).type == torch.device(device).type, (name, layout)
            assert res[layout]["mixed_precision"] == precision
            assert res[layout]["dtypes"] == ["torch.float32"]  # bf16 is autocast; weights stay fp32
            assert res[layout]["rows"] > 1  # gradients accumulate over several micro-batches


def test_rows_score_each_sample_as_if_alone_on_the_device(runs: dict[str, Path]) -> None:
    """Packed rows (block-diagonal mask from restarting positions) and prefix trees (an explicit
    additive mask) give every sample the logprobs it has computed alone."""
    res = result(runs, "gpu")
    for layout in ("shared", "packed"):
        assert_logprobs_close(res[layout]["before"], res[layout]["alone"], atol=1e-5)


def test_steps_on_the_device_match_the_cpu(runs: dict[str, Path], start: dict[str, torch.Tensor]) -> None:
    cpu, gpu = result(runs, "cpu")["shared"], result(runs, "gpu")["shared"]
    assert_logprobs_close(gpu["before"], cpu["before"], atol=LOGPROB_ATOL)
    assert_same_steps(gpu["stats"], cpu["stats"])
    assert [s["computed_tokens"] for s in gpu["stats"]] == [s["computed_tokens"] for s in cpu["stats"]]
    assert_same_update(start, weights(runs, "gpu", "shared"), weights(runs, "cpu", "shared"))


def test_shared_and_packed_steps_agree_on_the_device(
    runs: dict[str, Path], start: dict[str, torch.Tensor]
) -> None:
    shared, packed = result(runs, "gpu")["shared"], result(runs, "gpu")["packed"]
    assert_same_steps(shared["stats"], packed["stats"])
    for s, p in zip(shared["stats"], packed["stats"], strict=True):
        assert s["computed_tokens"] < 0.6 * p["computed_tokens"]  # the shared prefixes, computed once
    assert_same_update(start, weights(runs, "gpu", "shared"), weights(runs, "gpu", "packed"))


def test_lora_steps_on_the_device_match_the_cpu(
    runs: dict[str, Path], start: dict[str, torch.Tensor]
) -> None:
    """Only the adapter moves (the base stays bit for bit), and it moves as on the CPU."""
    cpu, gpu = result(runs, "cpu")["shared-lora"], result(runs, "gpu")["shared-lora"]
    assert_logprobs_close(gpu["before"], cpu["before"], atol=LOGPROB_ATOL)
    assert_same_steps(gpu["stats"], cpu["stats"])
    a, b = weights(runs, "gpu", "shared-lora"), weights(runs, "cpu", "shared-lora")
    lora = sorted(n for n in a if "lora_" in n)
    assert lora and sorted(a) == sorted(b)
    base = {n.replace("base_model.model.", "").replace(".base_layer", ""): n for n in a if "lora_" not in n}
    assert len(base) == len(start), "the LoRA model holds the base's tensors beside its adapter"
    for plain, name in base.items():
        assert torch.equal(a[name], start[plain]), f"{name} moved: the base is frozen under LoRA"
    for name in lora:
        diff = (a[name] - b[name]).abs().max().item()
        assert diff <= WEIGHT_ATOL, f"{name}: the adapters differ by {diff:.2e} after the same steps"
    moved = sum(int(a[n].abs().max() > LR / 2) for n in lora if "lora_B" in n)  # B starts at 0
    assert moved > len([n for n in lora if "lora_B" in n]) // 2, "the adapter barely moved"


def test_a_bf16_step_on_the_device(runs: dict[str, Path]) -> None:
    """Autocast is on (the logprobs are bf16's), the loss is finite and near fp32's, every update applied."""
    bf16, fp32 = result(runs, "bf16")["shared"], result(runs, "gpu")["shared"]
    assert_logprobs_close(bf16["before"], fp32["before"], atol=0.1)
    assert bf16["before"] != fp32["before"]
    for b, f in zip(bf16["stats"], fp32["stats"], strict=True):
        assert math.isfinite(b["loss"]) and math.isfinite(b["grad_norm"]) and b["skipped_updates"] == 0
        assert b["loss"] == pytest.approx(f["loss"], abs=0.01), (b["loss"], f["loss"])
        assert b["trained_tokens"] == f["trained_tokens"]
