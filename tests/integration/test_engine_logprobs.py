"""Input logprobs of the embedded engine over HTTP (`return_logprob` + `logprob_start_len`, SGLang's
prompt logprobs), against a plain transformers forward pass of the same model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmrl.services.engine.client import EngineClient
from swarmrl.services.engine.engine_core import EngineCore
from tests.support.localstack import embedded_engine

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
SCORE = {"max_new_tokens": 0, "temperature": 0}


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[EngineCore, str]]:
    with embedded_engine(tiny_model_dir, max_batch=8) as served:
        yield served


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def token_logprobs(model: AutoModelForCausalLM, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from one unpadded forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


async def test_prompt_logprobs_match_a_plain_forward(
    served: tuple[EngineCore, str], reference: AutoModelForCausalLM
) -> None:
    ref = token_logprobs(reference, PROMPT)
    async with httpx.AsyncClient(base_url=served[1], timeout=60) as http:
        for start in (0, 3, len(PROMPT) - 1):
            body = {
                "input_ids": PROMPT,
                "sampling_params": SCORE,
                "return_logprob": True,
                "logprob_start_len": start,
            }
            out = (await http.post("/generate", json=body)).json()
            entries = out["meta_info"]["input_token_logprobs"]
            assert [e[1] for e in entries] == PROMPT[start:]  # one per token from the start
            assert entries[0][0] is None  # SGLang pads the first one, whatever the start
            assert [e[0] for e in entries[1:]] == pytest.approx(ref[start:], abs=1e-4)
            assert out["output_ids"] == [] and out["meta_info"]["completion_tokens"] == 0
            assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


async def test_batch_with_per_prompt_starts_is_scored_like_one_by_one(
    served: tuple[EngineCore, str], reference: AutoModelForCausalLM
) -> None:
    core, url = served
    prompts = [PROMPT, [40, 41, 42], [7] * 12, [3, 1, 4, 1, 5, 9, 2, 6]]
    starts = [2, 0, 5, 7]
    async with EngineClient(url) as client:
        results = await client.generate_batch(prompts, SCORE, True, starts)
    for prompt, start, res in zip(prompts, starts, results, strict=True):
        assert res.input_logprobs[0] is None and len(res.input_logprobs) == len(prompt) - start
        assert res.input_logprobs[1:] == pytest.approx(token_logprobs(reference, prompt)[start:], abs=1e-4)
    assert sum(core.stats()["score_batch_sizes"].values()) >= 1


async def test_text_input_and_token_text(served: tuple[EngineCore, str]) -> None:
    core, url = served
    ids = core.encode("hello there, judge")
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        body = {
            "text": "hello there, judge",
            "sampling_params": SCORE,
            "return_logprob": True,
            "logprob_start_len": 1,
            "return_text_in_logprobs": True,
        }
        entries = (await http.post("/generate", json=body)).json()["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids[1:]
    assert [e[2] for e in entries] == [core.tokenizer.decode([t]) for t in ids[1:]]


async def test_generation_with_input_logprobs_is_unchanged(
    served: tuple[EngineCore, str], reference: AutoModelForCausalLM
) -> None:
    greedy = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=served[1], timeout=60) as http:
        plain = (await http.post("/generate", json={"input_ids": PROMPT, "sampling_params": greedy})).json()
        body = {
            "input_ids": PROMPT,
            "sampling_params": greedy,
            "return_logprob": True,
            "logprob_start_len": 4,
        }
        both = (await http.post("/generate", json=body)).json()
        default = (await http.post("/generate", json={**body, "logprob_start_len": -1})).json()
        off = (await http.post("/generate", json={**body, "return_logprob": False})).json()
    assert both["output_ids"] == plain["output_ids"] and len(both["output_ids"]) == 5
    lps = [e[0] for e in both["meta_info"]["input_token_logprobs"][1:]]
    assert lps == pytest.approx(token_logprobs(reference, PROMPT)[4:], abs=1e-4)
    assert default["meta_info"]["input_token_logprobs"] == []  # -1: output logprobs only
    assert "input_token_logprobs" not in off["meta_info"]  # no return_logprob: no logprobs at all


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"logprob_start_len": len(PROMPT)}, f"must be -1 or in [0, {len(PROMPT)})"),
        ({"logprob_start_len": -2}, "logprob_start_len=-2"),
        ({"logprob_start_len": "1"}, "logprob_start_len='1'"),
        ({"logprob_start_len": [0, 1]}, "logprob_start_len has 2 entries for 1 prompts"),
    ],
)
async def test_bad_logprob_start_len_gets_400(
    served: tuple[EngineCore, str], extra: dict, needle: str
) -> None:
    body = {"input_ids": PROMPT, "sampling_params": SCORE, "return_logprob": True, **extra}
    async with httpx.AsyncClient(base_url=served[1], timeout=60) as http:
        resp = await http.post("/generate", json=body)
    assert resp.status_code == 400
    assert needle in resp.json()["error"]["message"]
