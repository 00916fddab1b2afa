"""The embedded engine on the GPU against the same engine on the CPU: greedy token ids and their
logprobs, rows that join a running batch, input logprobs, weight reloads, and a bf16 engine."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.outputs import GenerationOutput
from tests.gpu.device import DEVICE, DEVICE_TYPE, LOGPROB_ATOL, NEAR_TIE, needs_device
from tests.unit.engine.helpers import params, reference_logprobs, save_perturbed, wait_until

pytestmark = [pytest.mark.gpu, needs_device]

# different lengths, so that rows are left-padded, and one long enough to decode while others join
PROMPTS = [[9] * 20, [5, 17, 33, 90, 4], [200, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19], [640]]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def cpu_engine(tiny_model_dir: Path) -> Iterator[EngineCore]:
    core = EngineCore(tiny_model_dir, max_batch=8, device="cpu")
    yield core
    core.close()


@pytest.fixture(scope="module")
def gpu_engine(tiny_model_dir: Path) -> Iterator[EngineCore]:
    core = EngineCore(tiny_model_dir, max_batch=8, device=DEVICE)
    yield core
    core.close()


def run_joined(engine: EngineCore, prompts: list[list[int]], **sp: int | float) -> list[GenerationOutput]:
    """The first prompt decodes alone for a few steps, then the others join its batch (cache joins,
    left padding, and cuts as rows finish at different lengths)."""
    longer = {**sp, "max_new_tokens": sp["max_new_tokens"] + 8}
    first = engine.submit(prompts[0], params(engine, **longer))
    steps = engine.stats()["decode_steps"]
    wait_until(lambda: engine.stats()["decode_steps"] >= steps + 3, what="the first request to decode")
    later = [engine.submit(p, params(engine, **sp)) for p in prompts[1:]]
    return [f.result(60) for f in [first, *later]]


def top2_gap(engine: EngineCore, ids: list[int]) -> float:
    """How far apart the two most likely next tokens after `ids` are, in logits."""
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([ids], device=engine.device)).logits[0, -1]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def assert_same_greedy(
    reference: EngineCore, prompt: list[int], ref: GenerationOutput, out: GenerationOutput
) -> int:
    """Greedy ids equal the reference's, except after a near tie (either pick is then the argmax
    within float error), and their logprobs are close; returns how many tokens were compared."""
    a, b = ref.output_ids, out.output_ids
    assert len(a) == len(b), (a, b)
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    if k < len(a):
        gap = top2_gap(reference, prompt + a[:k])
        assert gap < NEAR_TIE, (
            f"greedy ids differ at {k} ({a} vs {b}); the top two logits are {gap:.2e} apart"
        )
    torch.testing.assert_close(
        torch.tensor(out.output_logprobs[:k]),
        torch.tensor(ref.output_logprobs[:k]),
        atol=LOGPROB_ATOL,
        rtol=0,
    )
    return k


def test_the_engine_runs_on_the_device(gpu_engine: EngineCore) -> None:
    assert {p.device.type for p in gpu_engine.model.parameters()} == {DEVICE_TYPE}
    assert {p.dtype for p in gpu_engine.model.parameters()} == {torch.float32}


def test_greedy_batch_matches_the_cpu_engine(cpu_engine: EngineCore, gpu_engine: EngineCore) -> None:
    ref = run_joined(cpu_engine, PROMPTS, **GREEDY)
    before = gpu_engine.stats()["decode_steps"]
    out = run_joined(gpu_engine, PROMPTS, **GREEDY)
    compared = [assert_same_greedy(cpu_engine, p, r, o) for p, r, o in zip(PROMPTS, ref, out, strict=True)]
    total = sum(len(o.output_ids) for o in out)
    assert sum(compared) >= total // 2, f"only {compared} of {total} tokens compared (near ties)"
    assert gpu_engine.stats()["max_batch_seen"] > 1
    # 5 requests x 16-24 tokens decoded together, not one after the other
    assert gpu_engine.stats()["decode_steps"] - before < 48
    assert all(all(lp <= 0.0 for lp in o.output_logprobs) for o in out)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampled_logprobs_match_a_plain_forward_on_the_device(
    gpu_engine: EngineCore, temperature: float
) -> None:
    """Rows that joined a running batch get log_softmax(logits / T) of one unbatched forward."""
    sp = {"temperature": temperature, "top_p": 0.9, "max_new_tokens": 16, "ignore_eos": True, "seed": 3}
    outs = run_joined(gpu_engine, PROMPTS, **sp)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ref = reference_logprobs(gpu_engine, prompt, out.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=LOGPROB_ATOL, rtol=0)


def test_input_logprobs_match_the_cpu_engine(cpu_engine: EngineCore, gpu_engine: EngineCore) -> None:
    """Scored prompts (max_new_tokens=0, batched in one forward) and a generation that also returns
    its prompt's logprobs (the prefill keeps more than the last position's logits)."""
    scored = [(PROMPTS[0], 3), (PROMPTS[1], 0), (PROMPTS[3], 2), ([3, 1, 4, 1, 5, 9, 2, 6], 5)]
    score = {"temperature": 0, "max_new_tokens": 0}
    results = []
    for engine in (cpu_engine, gpu_engine):
        futures = [engine.submit(p, params(engine, **score), logprob_start_len=s) for p, s in scored]
        futures.append(engine.submit(PROMPTS[0], params(engine, **GREEDY), logprob_start_len=5))
        results.append([f.result(60) for f in futures])
    for ref, out in zip(*results, strict=True):
        assert out.input_logprobs[0] is None and len(out.input_logprobs) == len(ref.input_logprobs) > 1
        torch.testing.assert_close(
            torch.tensor(out.input_logprobs[1:]),
            torch.tensor(ref.input_logprobs[1:]),
            atol=LOGPROB_ATOL,
            rtol=0,
        )
    assert results[1][-1].output_ids == results[0][-1].output_ids


def test_weight_reload_on_the_device(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Reloaded tensors land on the device bit for bit; the engine then generates what a CPU engine
    started from those weights does, and reloading the first weights brings its outputs back."""
    other = save_perturbed(tiny_model_dir, tmp_path / "other")
    core = EngineCore(tiny_model_dir, max_batch=8, device=DEVICE, weight_version="0")
    reference = EngineCore(other, max_batch=8, device="cpu")
    try:
        before = run_joined(core, PROMPTS, **GREEDY)
        ok, message = core.update_weights_from_disk(str(other), "5")
        assert ok, message
        assert core.weight_version == "5"
        theirs = dict(reference.model.named_parameters())
        for name, p in core.model.named_parameters():
            assert p.device.type == DEVICE_TYPE, name
            assert torch.equal(p.detach().cpu(), theirs[name].detach()), name
        new = run_joined(core, PROMPTS, **GREEDY)
        ref = run_joined(reference, PROMPTS, **GREEDY)
        assert {o.weight_version for o in new} == {"5"}
        assert [o.output_ids for o in new] != [o.output_ids for o in before]
        for p, r, o in zip(PROMPTS, ref, new, strict=True):
            assert_same_greedy(reference, p, r, o)
        ok, message = core.update_weights_from_disk(str(tiny_model_dir))
        assert ok and core.weight_version == "6", message
        again = run_joined(core, PROMPTS, **GREEDY)
        assert [o.output_ids for o in again] == [o.output_ids for o in before]
    finally:
        core.close()
        reference.close()


def test_a_bf16_engine_on_the_device(tiny_model_dir: Path, gpu_engine: EngineCore) -> None:
    core = EngineCore(tiny_model_dir, max_batch=8, device=DEVICE, dtype="bfloat16")
    try:
        assert {p.dtype for p in core.model.parameters()} == {torch.bfloat16}
        out = run_joined(core, PROMPTS, **GREEDY)
        fp32 = run_joined(gpu_engine, PROMPTS, **GREEDY)
        for o, f in zip(out, fp32, strict=True):
            assert len(o.output_ids) == len(f.output_ids)
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in o.output_logprobs)
            # the first token sees the same prompt in both: its logprob differs by bf16 rounding only
            if o.output_ids[0] == f.output_ids[0]:
                assert o.output_logprobs[0] == pytest.approx(f.output_logprobs[0], abs=0.1)
    finally:
        core.close()
