"""The OpenAI-compatible gateway driven by the real `openai` SDK, over the real embedded engine and NATS."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import openai
import pytest

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.tokens import Claims, mint
from tests.support.localstack import llm_events

MSGS = [
    {"role": "system", "content": "Play."},
    {"role": "user", "content": "Guess a number between 1 and 64."},
]


async def test_plain_completion_is_recorded_token_exact(stack, swarm) -> None:
    async with swarm.episode("t1", models=["policy"], heartbeat_s=0) as ep:
        resp = await ep.openai().chat.completions.create(model="policy", messages=MSGS, max_tokens=12, seed=1)
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    (ev,) = await llm_events(stack.nats, ep.episode_id)
    assert resp.usage.prompt_tokens == len(ev.prompt_ids) and resp.usage.completion_tokens == len(
        ev.output_ids
    )
    assert len(ev.output_logprobs) == len(ev.output_ids) and all(lp <= 0 for lp in ev.output_logprobs)
    assert (ev.agent, ev.model, ev.client_version) == ("agent", "policy", "test-v1")
    assert ev.prompt_ids == stack.gateway.gateway.models["policy"].builder.encode(
        stack.gateway.gateway.models["policy"].builder.render(MSGS, [], gen_prompt=True)
    )


async def test_multi_turn_prompts_extend_earlier_calls_exactly(stack, swarm) -> None:
    async with swarm.episode("t2", models=["policy"], heartbeat_s=0) as ep:
        llm = ep.openai()
        messages = list(MSGS)
        for _ in range(4):
            resp = await llm.chat.completions.create(model="policy", messages=messages, max_tokens=8)
            messages += [
                {"role": "assistant", "content": resp.choices[0].message.content},
                {"role": "user", "content": "higher"},
            ]
    events = await llm_events(stack.nats, ep.episode_id)
    assert len(events) == 4 and [e.seq for e in events] == [0, 1, 2, 3]
    for prev, nxt in zip(events, events[1:], strict=False):
        assert (
            nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        )


async def test_streaming_returns_sse_chunks_that_add_up(stack, swarm) -> None:
    async with swarm.episode("t3", models=["policy"], heartbeat_s=0) as ep:
        stream = await ep.openai().chat.completions.create(
            model="policy", messages=MSGS, max_tokens=16, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    (ev,) = await llm_events(stack.nats, ep.episode_id)
    assert len(chunks) >= 3 and finishes in (["stop"], ["length"])
    assert text == ev.output_text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(ev.output_ids)


async def test_tool_calls_round_trip_in_openai_format(stack, swarm) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            },
        }
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
    }
    history = [
        *MSGS[:1],
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    async with swarm.episode("t4", models=["policy"], heartbeat_s=0) as ep:
        resp = await ep.openai().chat.completions.create(
            model="policy", messages=history, tools=tools, max_tokens=8
        )
    (ev,) = await llm_events(stack.nats, ep.episode_id)
    assert ev.tools == tools and ev.messages[2]["tool_calls"][0]["function"]["name"] == "calculator"
    prompt = stack.engine.tokenizer.decode(ev.prompt_ids)
    assert '{"expression": "2+3"}' in prompt and "<tool_response>\n5\n</tool_response>" in prompt
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")


async def test_auth_and_request_errors_are_openai_style(stack, swarm) -> None:
    secret = stack.gateway.gateway.secret
    base = stack.base_url
    async with swarm.episode("t5", models=["policy"], heartbeat_s=0) as ep:
        good = ep.token()
        cases = [
            (
                "forged",
                openai.AuthenticationError,
                {"api_key": mint(b"wrong", Claims(ep.episode_id, "a", (), time.time() + 60))},
            ),
            (
                "expired",
                openai.AuthenticationError,
                {"api_key": mint(secret, Claims(ep.episode_id, "a", (), time.time() - 1))},
            ),
            ("garbage", openai.AuthenticationError, {"api_key": "sk-not-a-token"}),
            ("unknown model", openai.NotFoundError, {"api_key": good, "model": "nope"}),
            (
                "not allowed",
                openai.PermissionDeniedError,
                {"api_key": mint(secret, Claims(ep.episode_id, "a", ("other",), time.time() + 60))},
            ),
            ("empty messages", openai.BadRequestError, {"api_key": good, "messages": []}),
            (
                "bad role",
                openai.BadRequestError,
                {"api_key": good, "messages": [{"role": "wizard", "content": "x"}]},
            ),
            ("n=2", openai.BadRequestError, {"api_key": good, "n": 2}),
        ]
        for name, error, over in cases:
            client = openai.AsyncOpenAI(base_url=base, api_key=over.pop("api_key"), max_retries=0)
            kwargs = {"model": "policy", "messages": MSGS, "max_tokens": 4} | over
            with pytest.raises(error) as err:
                await client.chat.completions.create(**kwargs)
            assert err.value.body and "message" in err.value.body, name
        # Context overflow: a clear 400, never a crash; and the gateway still serves afterwards.
        huge = [{"role": "user", "content": " ".join(["9"] * 5000)}]
        with pytest.raises(openai.BadRequestError) as err:
            await ep.openai(max_retries=0).chat.completions.create(model="policy", messages=huge)
        assert err.value.code == "context_length_exceeded"
        ok = await ep.openai().chat.completions.create(model="policy", messages=MSGS, max_tokens=4)
        assert ok.choices[0].message.role == "assistant"


async def test_each_agent_may_call_only_the_models_its_token_names(stack, swarm) -> None:
    agent_models = {"caller": ["policy"], "scorer": []}  # e.g. a scripted agent that calls no model
    async with swarm.episode("t9", agent_models=agent_models, heartbeat_s=0) as ep:
        ok = await ep.openai("caller").chat.completions.create(model="policy", messages=MSGS, max_tokens=4)
        with pytest.raises(openai.PermissionDeniedError) as err:
            await ep.openai("scorer", max_retries=0).chat.completions.create(
                model="policy", messages=MSGS, max_tokens=4
            )
    assert ok.choices[0].message.role == "assistant" and err.value.code == "model_not_allowed"
    (ev,) = await llm_events(stack.nats, ep.episode_id)
    assert ev.agent == "caller"


async def test_max_tokens_beyond_context_is_capped_by_the_context(stack, swarm) -> None:
    handle = stack.gateway.gateway.models["policy"]
    base = len(handle.builder.encode(handle.builder.render([{"role": "user", "content": ""}], [], True)))
    room = 12
    filler = "9" * (handle.context_len - base - room)  # digits are single tokens: prompt = ctx - room
    async with swarm.episode("t6", models=["policy"], heartbeat_s=0) as ep:
        resp = await ep.openai().chat.completions.create(
            model="policy", messages=[{"role": "user", "content": filler}], max_tokens=10 * handle.context_len
        )
    (ev,) = await llm_events(stack.nats, ep.episode_id)
    assert len(ev.prompt_ids) == handle.context_len - room
    assert len(ev.prompt_ids) + len(ev.output_ids) <= handle.context_len
    if resp.choices[0].finish_reason == "length":
        assert len(ev.output_ids) == room


async def test_concurrent_calls_from_many_episodes(stack, swarm) -> None:
    async def one(i: int) -> str:
        async with swarm.episode(f"t7-{i}", models=["policy"], heartbeat_s=0) as ep:
            llm = ep.openai()
            r1 = await llm.chat.completions.create(model="policy", messages=MSGS, max_tokens=8)
            follow = [
                *MSGS,
                {"role": "assistant", "content": r1.choices[0].message.content},
                {"role": "user", "content": "lower"},
            ]
            await llm.chat.completions.create(model="policy", messages=follow, max_tokens=8)
            return ep.episode_id

    ids = await asyncio.gather(*(one(i) for i in range(16)))
    events = await llm_events(stack.nats)
    by_episode = {i: [e for e in events if e.episode_id == i] for i in ids}
    assert all(len(v) == 2 for v in by_episode.values())
    for a, b in by_episode.values():
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.output_ids)] == a.prompt_ids + a.output_ids
    assert max(stack.engine.stats()["batch_sizes"]) > 1, "concurrent requests were never batched"


async def test_completions_over_nats_request_reply(stack, swarm, swarm_nats: NatsServer) -> None:
    ep = await swarm.episode("t8", models=["policy"], heartbeat_s=0).begin()
    nc = await nats.connect(**swarm_nats.agent.nats_options())
    body = {"api_key": ep.token(), "request": {"model": "policy", "messages": MSGS, "max_tokens": 6}}
    reply = json.loads(
        (await nc.request(S.llm_subject("policy"), json.dumps(body).encode(), timeout=30)).data
    )
    assert reply["response"]["choices"][0]["message"]["role"] == "assistant"
    bad = json.loads(
        (
            await nc.request(
                S.llm_subject("policy"), json.dumps({**body, "api_key": "x"}).encode(), timeout=30
            )
        ).data
    )
    assert bad["status"] == 401 and bad["error"]["code"] == "invalid_api_key"
    await ep.end()
    await nc.close()
    assert len(await llm_events(stack.nats, ep.episode_id)) == 1
