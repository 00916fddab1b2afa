"""A trainer of several processes (`accelerate launch`, DDP over gloo on the CPU) takes the same steps
to the same weights as one process, with prefix sharing on.

Both run `tests/learner_runs.py` from the same weights, seed and samples (a GRPO group and an
episode's nested timelines); under two processes each trains its shard of every step (whole prefix
trees, `batching.shard`) and DDP sums the gradients, whose scale is set by the tokens of all shards.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swarmrl.infra.nats_server import NatsServer, free_port
from swarmrl.launch import accelerate_launch
from swarmrl.schemas import ModelVersion, decode
from swarmrl.services.common import bus
from tests.integration.test_trainer import MODEL, group, publish

ROOT = Path(__file__).resolve().parents[2]
LR = 1e-3
# Adam's first steps move each weight by about lr whatever its gradient's size, so a weight whose
# gradient is within float error of 0 may move by a fraction of lr in one run and not the other; a
# wrong gradient (a shard counted twice, or scaled by its own tokens) moves many weights by a whole lr.
WEIGHT_ATOL = 0.25 * LR


def launch(processes: int, model_dir: Path, out: Path, layout: str = "shared") -> dict:
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    script = ["-m", "tests.learner_runs", str(model_dir), str(out), "cpu", "no", layout]
    if processes == 1:
        cmd = [sys.executable, *script]
    else:  # --multi_gpu picks the distributed launcher; ACCELERATE_USE_CPU makes it gloo on the CPU
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
            "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(free_port()), *script,
        ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (
        f"{processes} processes failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return json.loads((out / "result.json").read_text())[layout]


@pytest.mark.timeout(600)
def test_two_processes_take_the_same_steps_as_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    one = launch(1, tiny_model_dir, tmp_path / "one")
    two = launch(2, tiny_model_dir, tmp_path / "two")
    assert (one["processes"], two["processes"]) == (1, 2)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    w1 = load_file(str(tmp_path / "one" / "shared.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "shared.safetensors"))
    assert w1.keys() == w2.keys()
    moved = 0
    for name in w1:
        torch.testing.assert_close(
            w2[name], w1[name], atol=WEIGHT_ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}"
        )
        if name in start:
            moved += int((w1[name] - start[name].float()).abs().max() > LR / 2)
    assert moved > len(w1) // 2, "the steps barely moved the weights: the comparison would prove nothing"
    for s1, s2 in zip(one["stats"], two["stats"], strict=True):
        # the step's loss and token counts are sums over all processes' shards
        assert (s2["trained_tokens"], s2["tokens"]) == (s1["trained_tokens"], s1["tokens"])
        assert s2["loss"] == pytest.approx(s1["loss"], rel=1e-4, abs=1e-6)


@pytest.mark.timeout(600)
def test_two_processes_train_the_same_lora_adapter_as_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    one = launch(1, tiny_model_dir, tmp_path / "one", "shared-lora")
    two = launch(2, tiny_model_dir, tmp_path / "two", "shared-lora")
    assert (one["processes"], two["processes"]) == (1, 2)
    w1 = load_file(str(tmp_path / "one" / "shared-lora.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "shared-lora.safetensors"))
    lora = [n for n in w1 if "lora_B" in n]
    assert lora and w1.keys() == w2.keys()
    for name in w1:  # the base is frozen in both; the adapters take the same steps
        torch.testing.assert_close(
            w2[name], w1[name], atol=WEIGHT_ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}"
        )
    moved = sum(int(w1[n].abs().max() > LR / 2) for n in lora)  # B starts at 0
    assert moved > len(lora) // 2, "the adapter barely moved: the comparison would prove nothing"


@pytest.mark.timeout(600)
def test_the_trainer_service_under_two_processes_steps_and_serves_the_version(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`swarmrl serve trainer` under `accelerate launch`: process 0 takes the samples in and publishes,
    process 1 follows its steps (`service.follow`); both save the step's checkpoint and stop at
    `max_steps`, and the version engines are pointed at is the step's."""

    async def publish_group() -> None:
        nc = await bus.connect(swarm_nats.service_url, "test")
        await publish(nc.jetstream(), group("g0"))
        await nc.close()

    async def served() -> list[ModelVersion]:
        nc = await bus.connect(swarm_nats.service_url, "test")
        kv = await bus.models_kv(nc.jetstream())
        history = [decode(e.value, ModelVersion) for e in await kv.history(MODEL)]
        await nc.close()
        return history

    asyncio.run(publish_group())
    launch, env = accelerate_launch(2)
    cmd = [sys.executable, *launch, "-m", "swarmrl.cli", "serve", "trainer", "--model", MODEL,
           "--model-path", str(tiny_model_dir), "--run-dir", str(tmp_path / "run"), "--num-repeat", "4",
           "--batch-groups", "1", "--max-steps", "1", "--lr", "1e-3"]  # fmt: skip
    env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "SWARMRL_NATS": swarm_nats.service_url}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "reached max_steps=1" in proc.stderr, proc.stderr[-3000:]
    assert [(v.version, Path(v.path).name) for v in asyncio.run(served())][-1] == (1, "step-1")
    step = tmp_path / "run" / "checkpoints" / MODEL / "step-1"
    assert sorted(p.name for p in step.glob("optimizer-rank*.pt")) == [
        "optimizer-rank0.pt",
        "optimizer-rank1.pt",
    ]
