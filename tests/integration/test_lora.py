"""LoRA end to end on the project's tiny model: a trainer that trains an adapter only, checkpoints
that hold the adapter, and one embedded engine that serves several adapters of one base in one batch
(each with its own version), loaded at run time over HTTP and from KV `swarm-models`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmrl.infra.nats_server import NatsServer, free_port
from swarmrl.schemas import ModelVersion, encode
from swarmrl.services.common import bus
from swarmrl.services.engine.client import EngineClient, EngineError
from swarmrl.services.engine.config import EngineConfig
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.sampling import SamplingParams
from swarmrl.services.engine.service import EngineService
from swarmrl.services.trainer.batching import Scored, pack
from swarmrl.services.trainer.checkpoint import ADAPTER_CONFIG, TrainerState
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import Learner
from tests.conftest import wait_for
from tests.unit.engine.helpers import merged_logprobs, train_adapter
from tests.unit.trainer.samples import make_sample

PROMPT = [5, 6, 7, 8, 9]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


def _items(seed: int) -> list[Scored]:
    return [Scored(make_sample(f"s{seed}-{i}", 1.0, prompt=6, gen=8, vocab=500), 1.0) for i in range(4)]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: train_adapter(tiny_model_dir, root / name, seed) for seed, name in enumerate(("red", "blue"))
    }


def _reference(base: Path, adapter: Path | None, prompt: list[int], out: list[int]) -> list[float]:
    """Logprobs of `out` after `prompt` under the base with `adapter` merged into it (plain HF)."""
    lp = merged_logprobs(base, adapter, prompt, out)
    return lp[torch.arange(len(out)), torch.tensor(out)].tolist()


def test_lora_trainer_trains_the_adapter_only_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = TrainerConfig(model_path=str(tiny_model_dir), run_dir=str(tmp_path), lr=1e-2, lora_rank=4,
                        max_tokens_per_micro_batch=64)  # fmt: skip
    learner = Learner(cfg, tiny_model_dir)
    trainable = {n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in learner.model.named_parameters() if not p.requires_grad}
    items = _items(0)
    (mb,) = pack(items, 64)
    before = learner._logprobs(learner.model, mb).mean().item()
    for _ in range(3):
        learner.train_step(items, version=0)
    after = learner._logprobs(learner.model, mb).mean().item()
    assert after > before + 0.1, (before, after)
    for n, p in learner.model.named_parameters():
        if n in base_before:
            assert torch.equal(p, base_before[n]), f"{n} changed: the base is frozen under LoRA"
    ckpt = tmp_path / "step-3"
    learner.save(ckpt, TrainerState("m", 3, 3))
    assert (ckpt / ADAPTER_CONFIG).is_file() and (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists(), "a LoRA checkpoint holds the adapter only"
    resumed = Learner(cfg, ckpt)
    resumed.load_optimizer(ckpt)
    torch.testing.assert_close(resumed._logprobs(resumed.model, mb), learner._logprobs(learner.model, mb))
    learner.train_step(items, version=3)
    resumed.train_step(items, version=3)  # the same step from the restored optimizer: the same weights
    torch.testing.assert_close(resumed._logprobs(resumed.model, mb), learner._logprobs(learner.model, mb))
    with pytest.raises(ValueError, match="holds a LoRA adapter"):
        Learner(cfg.model_copy(update={"lora_rank": 0}), ckpt)


def test_one_engine_serves_several_adapters_in_one_batch(
    tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    engine = EngineCore(tiny_model_dir, adapters=["red", "blue"], max_batch=8)
    try:
        plain = engine.submit(PROMPT, GREEDY).result()
        fresh = engine.submit(PROMPT, GREEDY, adapter="red").result()  # not loaded yet: the base, version 0
        assert (fresh.output_ids, fresh.weight_version) == (plain.output_ids, "0")
        ok, message = engine.load_lora_adapter("red", str(adapters["red"]), "7")
        assert ok, message
        ok, message = engine.load_lora_adapter("blue", str(adapters["blue"]), "3")
        assert ok, message
        futures = {name: engine.submit(PROMPT, GREEDY, adapter=name) for name in ("red", None, "blue", "red")}
        outs = {name: f.result() for name, f in futures.items()}
        assert {n: o.weight_version for n, o in outs.items()} == {"red": "7", None: "0", "blue": "3"}
        assert outs[None].output_ids == plain.output_ids
        assert len({tuple(o.output_ids) for o in outs.values()}) == 3, "each adapter changes the answer"
        assert engine.stats()["max_batch_seen"] >= 2
        for name, out in outs.items():  # each row got exactly its own adapter
            want = _reference(tiny_model_dir, adapters[name] if name else None, PROMPT, out.output_ids)
            torch.testing.assert_close(out.output_logprobs, want, atol=2e-4, rtol=0)
        ok, _ = engine.load_lora_adapter(
            "red", str(adapters["blue"]), "8"
        )  # in place, another adapter's weights
        assert ok
        swapped = engine.submit(PROMPT, GREEDY, adapter="red").result()
        assert (swapped.output_ids, swapped.weight_version) == (outs["blue"].output_ids, "8")
        with pytest.raises(ValueError, match="unknown LoRA adapter 'c'"):
            engine.submit(PROMPT, GREEDY, adapter="c")
        assert not engine.load_lora_adapter("red", str(tiny_model_dir))[0]  # a full model dir is no adapter
        ok, message = engine.update_weights_from_disk(str(tiny_model_dir))
        assert not ok and "serves LoRA adapters" in message
    finally:
        engine.close()


def test_an_engine_of_one_adapter_merges_each_version_from_the_base(
    tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    engine = EngineCore(tiny_model_dir, adapters=["red"], max_batch=8)  # merge_lora: the default
    try:
        base = engine.model.state_dict()
        base = {k: v.clone() for k, v in base.items()}
        for version, name in ((3, "red"), (4, "blue"), (5, "red")):  # blue's weights under red's name
            ok, message = engine.load_lora_adapter("red", str(adapters[name]), str(version))
            assert ok, message
            assert engine.model is engine.base, "merged: no peft wrapper, the base model's own forward"
            out = engine.submit(PROMPT, GREEDY, adapter="red").result()
            assert out.weight_version == str(version)
            want = _reference(tiny_model_dir, adapters[name], PROMPT, out.output_ids)
            torch.testing.assert_close(out.output_logprobs, want, atol=2e-4, rtol=0)
        ok, _ = engine.load_lora_adapter("red", str(adapters["red"]), "6")
        again = engine.submit(PROMPT, GREEDY, adapter="red").result()
        assert again.output_ids == engine.submit(PROMPT, GREEDY, adapter="red").result().output_ids
        # merged from the base each time: red after blue is red, to the last bit
        red_only = EngineCore(tiny_model_dir, adapters=["red"], max_batch=8)
        try:
            assert red_only.load_lora_adapter("red", str(adapters["red"]), "6")[0]
            for key, tensor in red_only.model.state_dict().items():
                assert torch.equal(tensor, engine.model.state_dict()[key]), key
        finally:
            red_only.close()
        assert any(not torch.equal(base[k], v) for k, v in engine.model.state_dict().items())
        with pytest.raises(ValueError, match="merged into its weights"):
            engine.submit(PROMPT, GREEDY)  # the base is gone: requests must name the adapter
    finally:
        engine.close()


async def test_engine_service_loads_each_adapter_from_kv(
    swarm_nats: NatsServer, tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    cfg = EngineConfig(nats=swarm_nats.service_url, model="red", adapters=["red", "blue"],
                       model_path=str(tiny_model_dir), port=free_port())  # fmt: skip
    service = EngineService(cfg)
    await service.start()
    nc = await bus.connect(swarm_nats.service_url, "test")
    try:
        kv = await bus.models_kv(nc.jetstream())
        await kv.put("red", encode(ModelVersion(version=2, path=str(adapters["red"]))))
        await kv.put("blue", encode(ModelVersion(version=5, path=str(adapters["blue"]))))
        async with (
            EngineClient(service.url, adapter="red") as a,
            EngineClient(service.url, adapter="blue") as b,
        ):

            async def loaded() -> bool:
                return [(await c.model_info())["weight_version"] for c in (a, b)] == ["2", "5"]

            await wait_for(loaded, what="both adapters loaded from KV")
            greedy = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
            ra, rb = await a.generate(PROMPT, greedy), await b.generate(PROMPT, greedy)
            assert (ra.weight_version, rb.weight_version) == (2, 5) and ra.output_ids != rb.output_ids
            batch = await a.generate_batch([PROMPT, PROMPT], greedy)
            assert [r.output_ids for r in batch] == [ra.output_ids] * 2
            streamed = [r async for r in b.generate_stream(PROMPT, greedy)][-1]
            assert (streamed.output_ids, streamed.weight_version) == (rb.output_ids, 5)
            with pytest.raises(EngineError, match="serves no LoRA adapter 'c'"):
                await EngineClient(service.url, adapter="c").model_info()
            with pytest.raises(EngineError, match="needs non-empty strings `lora_name` and `lora_path`"):
                await a._call("POST", "/load_lora_adapter", {"lora_name": "red"})
            with pytest.raises(EngineError, match="unknown LoRA adapter 'green'"):
                await a.load_lora_adapter("green", str(adapters["red"]))
    finally:
        await nc.close()
        await service.stop()
