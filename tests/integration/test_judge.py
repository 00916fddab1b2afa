"""The model judge resource manager against the real embedded engine on the tiny model: scores equal
a plain transformers computation, likely text beats garbled text, concurrent actions share engine
calls, bad payloads are rejected and a dead or refusing engine gives error outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.infra.nats_server import free_port
from swarmrl.services.actions.judge import JudgeManager
from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.server import create_app
from tests.support.localstack import embedded_engine

PROMPT = "Question: what is 3 plus 4?\nAnswer:"
PAYLOADS = [
    {"prompt": f"{PROMPT} step {i}", "text": f" the sum is {i + 7}, done" + " ok" * (i % 4)}
    for i in range(16)
]


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    with embedded_engine(tiny_model_dir, max_batch=16) as (_, url):
        yield url


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[AutoModelForCausalLM, AutoTokenizer]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
async def judge(engine_url: str) -> AsyncIterator[JudgeManager]:
    manager = JudgeManager(engine_url, None, max_wait_s=0.05)  # None: the engine's tokenizer
    await manager.start(16)
    yield manager
    await manager.close()


def reference_score(reference: tuple[AutoModelForCausalLM, AutoTokenizer], prompt: str, text: str) -> float:
    """Mean log p(text token | prompt, earlier text tokens): log-softmax of one plain forward's logits."""
    model, tok = reference
    p_ids, t_ids = tok.encode(prompt), tok.encode(text, add_special_tokens=False)
    ids = torch.tensor([p_ids + t_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[len(p_ids) - 1 : -1], dim=-1)
    return lp[torch.arange(len(t_ids)), torch.tensor(t_ids)].mean().item()


async def test_score_is_the_mean_token_logprob(
    judge: JudgeManager, reference: tuple[AutoModelForCausalLM, AutoTokenizer]
) -> None:
    for payload in PAYLOADS[:3]:
        out = await judge.run(payload)
        assert out.status == "ok", out.error
        n_text = len(reference[1].encode(payload["text"], add_special_tokens=False))
        assert out.result["tokens"] == n_text
        assert out.result["score"] == pytest.approx(reference_score(reference, **payload), abs=1e-3)
        assert out.result["logprob_sum"] == pytest.approx(out.result["score"] * n_text)


async def test_likely_text_outscores_garbled_text(
    judge: JudgeManager, reference: tuple[AutoModelForCausalLM, AutoTokenizer]
) -> None:
    model, tok = reference
    gen = torch.Generator().manual_seed(0)
    for prompt in (PROMPT, "The tool returned", "Hello"):
        ids = tok.encode(prompt)
        with torch.no_grad():  # the model's own greedy continuation
            for _ in range(12):
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        likely = tok.decode(ids[len(tok.encode(prompt)) :])
        garbled = tok.decode(
            torch.randint(0, len(tok), (12,), generator=gen).tolist(), skip_special_tokens=True
        )
        good, bad = await asyncio.gather(
            judge.run({"prompt": prompt, "text": likely}), judge.run({"prompt": prompt, "text": garbled})
        )
        assert good.status == bad.status == "ok"
        assert good.result["score"] > bad.result["score"], (prompt, likely, garbled)


async def test_concurrent_actions_share_engine_calls(judge: JudgeManager) -> None:
    alone = [await judge.run(p) for p in PAYLOADS]  # one engine call each
    assert judge.counts["batches"] == len(PAYLOADS) and set(judge.batch_sizes) == {1}
    together = await asyncio.gather(*(judge.run(p) for p in PAYLOADS))
    calls = judge.counts["batches"] - len(PAYLOADS)
    assert calls < len(PAYLOADS) and max(judge.batch_sizes) > 1, dict(judge.batch_sizes)
    assert judge.counts["actions"] == 2 * len(PAYLOADS) and judge.counts["engine_errors"] == 0
    for one, many in zip(alone, together, strict=True):
        assert many.status == "ok" and many.result["tokens"] == one.result["tokens"]
        assert many.result["score"] == pytest.approx(one.result["score"], abs=1e-4)


async def test_units_bound_the_batch(engine_url: str) -> None:
    judge = JudgeManager(engine_url, None, max_wait_s=0.05)
    await judge.start(2)
    try:
        outs = await asyncio.gather(*(judge.run(p) for p in PAYLOADS[:8]))
        assert all(o.status == "ok" for o in outs) and max(judge.batch_sizes) <= 2
        await judge.resize(8)
        await asyncio.gather(*(judge.run(p) for p in PAYLOADS[:8]))
        assert max(judge.batch_sizes) > 2, dict(judge.batch_sizes)
    finally:
        await judge.close()


async def test_no_units_holds_actions_and_abandoned_ones_are_skipped(engine_url: str) -> None:
    judge = JudgeManager(engine_url, None, max_wait_s=0.05)
    await judge.start(0)
    try:
        with pytest.raises(TimeoutError):  # the caller's own deadline, as the worker's wall limit
            await asyncio.wait_for(judge.run(PAYLOADS[0]), 0.3)
        waiting = asyncio.create_task(judge.run(PAYLOADS[1]))
        await judge.resize(1)
        out = await asyncio.wait_for(waiting, 30)
        assert out.status == "ok"
        assert judge.counts["actions"] == 1  # the abandoned action never reached the engine
    finally:
        await judge.close()


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"text": "x"}, "no 'prompt' field"),
        ({"prompt": "a"}, "no 'text' field"),
        ({"prompt": 3, "text": "x"}, "field 'prompt' must be a string, got int"),
        ({"prompt": "a", "text": ["x"]}, "field 'text' must be a string, got list"),
        ({"prompt": "a", "text": ""}, "field 'text' is empty"),
        ({"prompt": "a", "text": "word " * 3000}, "too long"),
        ({"prompt": "a" * 300_000, "text": "b"}, "characters; the limit is"),
        ("just a string", "must be an object"),
    ],
)
async def test_bad_payloads_are_rejected(judge: JudgeManager, payload: object, needle: str) -> None:
    out = await judge.run(payload)  # type: ignore[arg-type]
    assert out.status == "rejected" and needle in out.error, out.error
    assert judge.counts["batches"] == 0 and judge.counts["rejected"] == 1


async def test_dead_engine_gives_errors_not_hangs(tiny_model_dir: Path) -> None:
    judge = JudgeManager(f"http://127.0.0.1:{free_port()}", str(tiny_model_dir), retries=2)
    await judge.start(4)
    try:
        outs = await asyncio.wait_for(asyncio.gather(*(judge.run(p) for p in PAYLOADS[:4])), 30)
    finally:
        await judge.close()
    assert [o.status for o in outs] == ["error"] * 4
    assert all("unreachable for 2 attempts" in o.error for o in outs)
    assert judge.counts["engine_errors"] == judge.counts["batches"] >= 1


async def test_engine_refusal_fails_its_batch(tiny_model_dir: Path) -> None:
    core = EngineCore(tiny_model_dir, context_length=16)  # shorter than the judge's own limit
    server = BackgroundServer(create_app(core)).start()
    judge = JudgeManager(server.url, None, max_wait_s=0.05)
    try:
        await judge.start(4)
        long = {"prompt": PROMPT, "text": " the answer is seven" * 3}
        outs = await asyncio.wait_for(asyncio.gather(judge.run(long), judge.run(long)), 30)
        assert [o.status for o in outs] == ["error", "error"]
        assert "engine error 400" in outs[0].error and "context length is 16" in outs[0].error
        short = await judge.run({"prompt": "a", "text": " b"})
        assert short.status == "ok"  # the engine is still fine
    finally:
        await judge.close()
        server.stop()
        core.close()


async def test_run_outside_start_and_close(engine_url: str) -> None:
    judge = JudgeManager(engine_url, None)
    assert (await judge.run(PAYLOADS[0])).status == "error"
    await judge.start(1)
    assert (await judge.run(PAYLOADS[0])).status == "ok"
    await judge.close()
    out = await judge.run(PAYLOADS[0])
    assert out.status == "error" and "not running" in out.error
