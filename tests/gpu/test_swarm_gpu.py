"""The engine service and the trainer service on the GPU, over a real nats-server: samples the
engine generated are trained on the GPU, the trainer's checkpoint reaches the engine through KV
`swarm-models`, and the engine then serves exactly those weights."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmrl.infra.nats_server import NatsServer, free_port
from swarmrl.schemas import ModelVersion, Sample, TrainStep, decode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.engine.client import EngineClient
from swarmrl.services.engine.config import EngineConfig
from swarmrl.services.engine.service import EngineService
from swarmrl.services.trainer.service import Trainer
from tests.conftest import wait_for
from tests.gpu.device import DEVICE, DEVICE_TYPE, LOGPROB_ATOL, needs_device
from tests.integration.test_trainer import MODEL, REWARDS, config, fetch_all, publish
from tests.unit.trainer.samples import make_sample

pytestmark = [pytest.mark.gpu, needs_device]

PROMPT = [5, 17, 33, 90, 4, 61, 2, 8]
GEN = 10


@pytest.fixture
async def engine(swarm_nats: NatsServer, tiny_model_dir: Path) -> AsyncIterator[EngineService]:
    """The engine service on the device, watching KV `swarm-models[tiny]`."""
    cfg = EngineConfig(
        model=MODEL, model_path=str(tiny_model_dir), port=free_port(), device=DEVICE, max_batch=8,
        nats=swarm_nats.service_url,
    )  # fmt: skip
    service = EngineService(cfg)
    await service.start()
    yield service
    await service.stop()


async def generate_group(client: EngineClient) -> list[Sample]:
    """A GRPO group of the engine's own completions (temperature 1, as the trainer assumes)."""
    outs = await asyncio.gather(
        *(
            client.generate(
                PROMPT, {"temperature": 1.0, "max_new_tokens": GEN, "ignore_eos": True, "sampling_seed": i}
            )
            for i in range(len(REWARDS))
        )
    )
    samples = []
    for i, (out, reward) in enumerate(zip(outs, REWARDS, strict=True)):
        assert out.weight_version == 0 and len(out.output_ids) == GEN
        base = make_sample(f"gpu-ep{i}", reward, group="gpu", prompt=len(PROMPT), gen=GEN, model=MODEL)
        update = {"token_ids": PROMPT + out.output_ids, "logprobs": [0.0] * len(PROMPT) + out.output_logprobs}
        samples.append(base.model_copy(update=update))
    return samples


def checkpoint_logprobs(path: str, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 under the checkpoint at `path`, on the CPU."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


@pytest.mark.timeout(240)
async def test_a_step_on_the_gpu_reaches_the_gpu_engine(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path, engine: EngineService
) -> None:
    assert engine.client is not None
    samples = await generate_group(engine.client)
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    await publish(js, samples)

    trainer = await Trainer.start(config(swarm_nats, tiny_model_dir, tmp_path, batch_groups=1, max_steps=1))
    await asyncio.wait_for(trainer.run(), timeout=150)  # returns at max_steps
    assert trainer.learner is not None and trainer.learner.accelerator.device.type == DEVICE_TYPE

    (step,) = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert step.samples == len(REWARDS) and step.trained_tokens == len(REWARDS) * GEN
    # the engine's logprobs are the trainer's: every token starts at ratio 1, none is clipped
    assert step.extra["clip_frac"] == 0.0 and step.extra["off_policy_frac"] == 0.0
    kv = await bus.models_kv(js)
    latest = decode((await kv.get(MODEL)).value, ModelVersion)
    assert latest.version == 1

    async def served_version() -> bool:
        assert engine.client is not None
        return (await engine.client.model_info())["weight_version"] == "1"

    await wait_for(served_version, timeout=60, what="the engine to reload version 1 from KV")
    ids = [s.token_ids for s in samples]
    scored = await engine.client.generate_batch(ids, {"max_new_tokens": 0, "temperature": 0}, True, 0)
    for sample, res in zip(samples, scored, strict=True):
        served = res.input_logprobs[1:]
        assert served == pytest.approx(checkpoint_logprobs(latest.path, sample.token_ids), abs=LOGPROB_ATOL)
        generated = served[len(PROMPT) - 1 :]  # served[j] is the logprob of token j + 1
        assert generated != pytest.approx(sample.logprobs[len(PROMPT) :], abs=1e-3)  # the weights moved
    await nc.close()
