"""LoRA adapters served on the GPU: one engine on the device generates for two adapters of one base
and the bare base in the same batches, each row with exactly its own adapter, and an adapter
replaced in place there serves the new weights. Every row is checked against a plain forward of
the base with that row's adapter merged into it, on the CPU. (The trainer's LoRA steps on the
device are checked against the CPU's in test_learner_gpu.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.outputs import GenerationOutput
from tests.gpu.device import DEVICE, DEVICE_TYPE, LOGPROB_ATOL, NEAR_TIE, needs_device
from tests.unit.engine.helpers import merged_logprobs, params, train_adapter

pytestmark = [pytest.mark.gpu, needs_device]

PROMPTS = [[5, 6, 7, 8, 9], [200, 7, 31], [11, 12, 13, 14, 15, 16, 17, 18]]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
NAMES = ("red", "blue")


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: train_adapter(tiny_model_dir, root / name, seed) for seed, name in enumerate(NAMES)}


@pytest.fixture
def engine(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[EngineCore]:
    core = EngineCore(tiny_model_dir, adapters=list(NAMES), max_batch=16, device=DEVICE)
    try:
        for version, name in enumerate(NAMES, start=1):
            ok, message = core.load_lora_adapter(name, str(adapters[name]), str(version))
            assert ok, message
        yield core
    finally:
        core.close()


def generate_mixed(engine: EngineCore) -> dict[tuple[str | None, int], GenerationOutput]:
    """Every prompt under the base and each adapter, all submitted at once (mixed batches)."""
    futures = {
        (name, i): engine.submit(prompt, params(engine, **GREEDY), adapter=name)
        for i, prompt in enumerate(PROMPTS)
        for name in (None, *NAMES)
    }
    return {key: f.result(60) for key, f in futures.items()}


def assert_matches_merged(base: Path, adapter: Path | None, prompt: list[int], out: GenerationOutput) -> None:
    """`out` is the greedy continuation of `prompt` under the base with `adapter` merged in (a pick
    may differ only where the top two logits are within NEAR_TIE), with that model's logprobs."""
    lp = merged_logprobs(base, adapter, prompt, out.output_ids)
    picked = lp[torch.arange(len(out.output_ids)), torch.tensor(out.output_ids)]
    torch.testing.assert_close(torch.tensor(out.output_logprobs), picked, atol=LOGPROB_ATOL, rtol=0)
    short = (lp.max(-1).values - picked).max().item()
    assert short < NEAR_TIE, f"a greedy pick is {short:.2e} below the best logit of the merged model"


def test_one_engine_on_the_device_serves_each_row_its_own_adapter(
    engine: EngineCore, tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    assert {p.device.type for p in engine.model.parameters()} == {DEVICE_TYPE}
    outs = generate_mixed(engine)
    assert engine.stats()["max_batch_seen"] >= 3, "the adapters' rows never shared a batch"
    for (name, i), out in outs.items():
        assert out.weight_version == {None: "0", "red": "1", "blue": "2"}[name]
        assert_matches_merged(tiny_model_dir, adapters[name] if name else None, PROMPTS[i], out)
    for i in range(len(PROMPTS)):  # each adapter changes the answers (else the check proves little)
        assert len({tuple(outs[(name, i)].output_ids) for name in (None, *NAMES)}) > 1, i


def test_an_adapter_replaced_in_place_on_the_device(
    engine: EngineCore, tiny_model_dir: Path, adapters: dict[str, Path]
) -> None:
    ok, message = engine.load_lora_adapter("red", str(adapters["blue"]), "9")
    assert ok, message
    outs = generate_mixed(engine)
    for i, prompt in enumerate(PROMPTS):
        red = outs[("red", i)]
        assert red.weight_version == "9"
        assert_matches_merged(tiny_model_dir, adapters["blue"], prompt, red)
        assert_matches_merged(tiny_model_dir, None, prompt, outs[(None, i)])
