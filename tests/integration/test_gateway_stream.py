"""Real token streaming through the gateway, driven by the `openai` SDK over the embedded engine and
NATS: chunks arrive while the engine decodes, the capture equals the non-streamed call's, a client
that leaves mid-stream aborts the engine request and records nothing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest

from swarmrl.services.gateway.replies import ReplyFormat
from tests.conftest import wait_for
from tests.support.localstack import generation_stack, llm_events

MSGS = [
    {"role": "system", "content": "Play."},
    {"role": "user", "content": "Guess a number between 1 and 64."},
]


async def test_chunks_arrive_while_the_engine_decodes(stack, swarm) -> None:
    async with swarm.episode("s1", models=["policy"], heartbeat_s=0) as ep:
        llm = ep.openai()
        await llm.chat.completions.create(model="policy", messages=MSGS, max_tokens=1)  # warm: first forward
        start = time.monotonic()
        stream = await llm.chat.completions.create(
            model="policy", messages=MSGS, max_tokens=40, temperature=0, stream=True
        )
        arrivals = [(time.monotonic() - start, chunk) async for chunk in stream]
    _, ev = await llm_events(stack.nats, ep.episode_id)
    assert len(ev.output_ids) == 40 and ev.finish_reason == "length"  # the whole budget was decoded
    content = [t for t, c in arrivals if c.choices and c.choices[0].delta.content]
    first, total = content[0], arrivals[-1][0]
    print(
        f"\nfirst content chunk {first * 1000:.0f} ms, last chunk {total * 1000:.0f} ms, {len(content)} chunks"
    )
    assert len(content) > 1
    # Generated after the engine finished, every chunk would come within a few ms of the last one.
    assert first < 0.5 * total, (first, total)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}])
async def test_streamed_capture_equals_the_non_streamed_one(stack, swarm, sampling: dict) -> None:
    args = {"model": "policy", "messages": MSGS, "max_tokens": 32, **sampling}
    async with swarm.episode("s2-plain", models=["policy"], heartbeat_s=0) as a:
        plain = await a.openai().chat.completions.create(**args)
    # the same prompt again would start from the first call's cached KV: equal to float rounding,
    # not bit for bit (tests/unit/engine/test_prefix_cache.py holds the cache to that)
    stack.engine.flush_cache()
    async with swarm.episode("s2-stream", models=["policy"], heartbeat_s=0) as b:
        stream = await b.openai().chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    (pe,) = await llm_events(stack.nats, a.episode_id)
    (se,) = await llm_events(stack.nats, b.episode_id)
    assert se.prompt_ids == pe.prompt_ids and se.output_ids == pe.output_ids
    assert se.output_logprobs == pe.output_logprobs  # bit for bit: the same final engine result
    assert (se.policy_version, se.output_text, se.finish_reason) == (
        pe.policy_version,
        pe.output_text,
        pe.finish_reason,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == se.output_text
    assert {c.id for c in chunks} == {se.call_id}
    assert [c.usage for c in chunks[:-1]] == [None] * (len(chunks) - 1) and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == len(se.output_ids) == plain.usage.completion_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]


async def test_with_tools_the_streamed_content_adds_up_to_the_reply(stack, swarm) -> None:
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    async with swarm.episode("s5", models=["policy"], heartbeat_s=0) as ep:
        stream = await ep.openai().chat.completions.create(
            model="policy", messages=MSGS, tools=tools, max_tokens=32, temperature=1.0, seed=3, stream=True
        )
        chunks = [c async for c in stream]
    (ev,) = await llm_events(stack.nats, ep.episode_id)
    reply = ReplyFormat().parse(ev.output_text, with_tools=True)
    content, calls = reply.content, reply.tool_calls
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not calls and not any(d.tool_calls for d in deltas)  # the tiny model calls no tool
    assert "".join(d.content or "" for d in deltas) == content and ev.tools == tools


async def test_reasoning_streams_as_reasoning_content_and_stays_out_of_the_content(
    swarm_nats, swarm, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A copy of the tiny model whose template opens a `<think>` block for the reply (as DeepSeek-R1's
    # and Qwen3's thinking models do): the random model never closes it, so its whole reply is reasoning.
    model = shutil.copytree(tiny_model_dir, tmp_path / "thinking")
    template = model / "chat_template.jinja"
    text = template.read_text()
    assert "'<|im_start|>assistant\\n'" in text
    template.write_text(
        text.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")
        + "{#- </think> -#}"
    )
    async with generation_stack(swarm_nats, model) as stack:
        assert stack.gateway.gateway.models["policy"].fmt == ReplyFormat("hermes", "think")
        async with swarm.episode("s6", models=["policy"], heartbeat_s=0) as ep:
            llm = ep.openai()
            plain = await llm.chat.completions.create(model="policy", messages=MSGS, max_tokens=24, seed=5)
            stream = await llm.chat.completions.create(
                model="policy", messages=MSGS, max_tokens=24, seed=5, stream=True
            )
            chunks = [c async for c in stream]
        first, second = await llm_events(stack.nats, ep.episode_id)
    message = plain.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert first.output_text == second.output_text and reasoning == first.output_text.strip()
    assert not message.content and "</think>" not in first.output_text
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert not "".join(d.content or "" for d in deltas)


async def test_a_client_that_leaves_mid_stream_aborts_the_engine_request(stack, swarm) -> None:
    before = stack.engine.stats()["requests_aborted"]
    body = {"model": "policy", "messages": MSGS, "max_tokens": 1500, "temperature": 0, "stream": True}
    async with swarm.episode("s3", models=["policy"], heartbeat_s=0) as ep:
        headers = {"Authorization": f"Bearer {ep.token()}"}
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http:
            async with http.stream("POST", "/chat/completions", json=body, headers=headers) as resp:
                assert resp.status_code == 200
                seen = 0
                async for line in resp.aiter_lines():
                    seen += '"content"' in line
                    if seen >= 3:
                        break  # leaving the block closes the connection
        await wait_for(
            lambda: stack.engine.stats()["requests_aborted"] == before + 1, what="the engine request aborted"
        )
        assert stack.engine.stats()["running"] == 0
        ok = await ep.openai().chat.completions.create(model="policy", messages=MSGS, max_tokens=4)
    events = await llm_events(stack.nats, ep.episode_id)
    assert ok.choices[0].message.role == "assistant"
    assert [e.seq for e in events] == [0] and len(events[0].output_ids) <= 4  # only the later call


async def test_streamed_request_errors_are_plain_http_errors(stack, swarm) -> None:
    async with swarm.episode("s4", models=["policy"], heartbeat_s=0) as ep:
        llm = ep.openai(max_retries=0)
        cases = [
            (openai.BadRequestError, {"n": 2}),
            (openai.NotFoundError, {"model": "nope"}),
            (openai.BadRequestError, {"messages": [{"role": "user", "content": " ".join(["9"] * 5000)}]}),
        ]
        for error, over in cases:
            with pytest.raises(error) as err:
                await llm.chat.completions.create(
                    **{"model": "policy", "messages": MSGS, "stream": True, **over}
                )
            assert err.value.status_code in (400, 404)
        bad_key = openai.AsyncOpenAI(base_url=stack.base_url, api_key="sk-nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad_key.chat.completions.create(model="policy", messages=MSGS, stream=True)
    assert await llm_events(stack.nats, ep.episode_id) == []
