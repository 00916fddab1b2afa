"""The embedded engine's streamed `/generate` over HTTP: SGLang's SSE format read with plain httpx,
`EngineClient.generate_stream`, and a client that disconnects mid-stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from swarmrl.services.engine.client import EngineClient, EngineError
from swarmrl.services.engine.engine_core import EngineCore
from tests.conftest import wait_for
from tests.support.localstack import embedded_engine

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[EngineCore, str]]:
    with embedded_engine(tiny_model_dir, max_batch=8) as served:
        yield served


def parse_sse(raw: str) -> list[dict]:
    """SGLang's stream: `data: <json>` events separated by blank lines, the last `data: [DONE]`."""
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]", raw[-200:]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks[:-1])
    return [json.loads(b[len("data: ") :]) for b in blocks[:-2]]


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
        {"temperature": 1.0, "max_new_tokens": 24, "sampling_seed": 5},  # bytes that merge into characters
    ],
)
async def test_stream_is_sglangs_cumulative_sse_and_ends_with_the_plain_answer(
    served: tuple[EngineCore, str], sampling: dict
) -> None:
    body = {"input_ids": PROMPT, "sampling_params": sampling, "return_logprob": True}
    async with httpx.AsyncClient(base_url=served[1], timeout=60) as http:
        resp = await http.post("/generate", json={**body, "stream": True})
        plain = (await http.post("/generate", json=body)).json()
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(resp.text)
    assert len(events) > 1
    for i, ev in enumerate(events):
        assert set(ev) == {"text", "output_ids", "meta_info"}
        meta, n = ev["meta_info"], len(ev["output_ids"])
        assert meta["completion_tokens"] == n == len(meta["output_token_logprobs"])  # cumulative
        assert [e[1] for e in meta["output_token_logprobs"]] == ev["output_ids"]
        assert (meta["prompt_tokens"], meta["weight_version"]) == (3, "0")
        assert (meta["finish_reason"] is None) == (i < len(events) - 1)
        assert ev["output_ids"] == plain["output_ids"][:n]
        assert meta["output_token_logprobs"] == plain["meta_info"]["output_token_logprobs"][:n]
        assert not ev["text"].endswith("\ufffd") or meta["finish_reason"] is not None
    for a, b in zip(events, events[1:], strict=False):
        assert len(b["output_ids"]) > len(a["output_ids"]) and b["text"].startswith(a["text"])
    last = events[-1]
    last["meta_info"].pop("id"), plain["meta_info"].pop("id")  # a fresh request id each
    assert last == plain


async def test_client_stream_equals_generate(served: tuple[EngineCore, str]) -> None:
    sampling = {"temperature": 0.8, "max_new_tokens": 16, "sampling_seed": 3}
    async with EngineClient(served[1]) as client:
        results = [r async for r in client.generate_stream(PROMPT, sampling)]
        whole = await client.generate(PROMPT, sampling)
    *partial, final = results
    assert partial and not any(r.finished for r in partial) and final.finished
    assert (final.output_ids, final.output_logprobs, final.text, final.finish_reason) == (
        whole.output_ids,
        whole.output_logprobs,
        whole.text,
        whole.finish_reason,
    )
    assert final.weight_version == whole.weight_version == 0
    for r in partial:
        assert r.output_ids == whole.output_ids[: len(r.output_ids)] and r.finish_reason == ""


async def test_bad_streamed_requests_are_http_errors(served: tuple[EngineCore, str]) -> None:
    async with EngineClient(served[1]) as client:
        with pytest.raises(EngineError) as err:
            async for _ in client.generate_stream([1, 10**6], {}):
                pass
    assert err.value.status == 400 and "outside the vocabulary" in err.value.message


async def test_a_client_that_disconnects_aborts_its_request(served: tuple[EngineCore, str]) -> None:
    core, url = served
    before = core.stats()["requests_aborted"]
    sampling = {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}
    async with EngineClient(url) as client:
        stream = client.generate_stream(PROMPT, sampling)
        async for r in stream:
            if len(r.output_ids) >= 3:
                break
        await stream.aclose()  # closes the connection
        await wait_for(lambda: core.stats()["requests_aborted"] == before + 1, what="the engine to abort")
        assert core.stats()["running"] == 0 and core.stats()["tokens_generated"] > 0
        assert len((await client.generate(PROMPT, {**sampling, "max_new_tokens": 2})).output_ids) == 2
