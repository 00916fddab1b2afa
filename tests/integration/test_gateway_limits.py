"""The gateway under a security probe's requests, over the real engine, gateway and nats-server:
oversized bodies, blocking work, out-of-range parameters, token lifetimes (issue 10, section 4)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from typing import Any

import httpx
import nats
import openai
import pytest

from swarmrl.agents import SwarmError
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.tokens import TokenError, verify
from tests.support.localstack import llm_events

MSGS = [{"role": "user", "content": "Guess a number between 1 and 64."}]


async def _send(
    url: str, head: dict[str, str], body: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a bare socket and send a POST's headers and `body` (maybe less than the headers announce)."""
    u = httpx.URL(url)
    reader, writer = await asyncio.open_connection(u.host, u.port)
    lines = [
        f"POST {u.raw_path.decode()} HTTP/1.1",
        f"Host: {u.host}",
        *(f"{k}: {v}" for k, v in head.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    return reader, writer


async def _raw_post(url: str, head: dict[str, str], body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """POST over a bare socket: the status and JSON body, sending only `body` (maybe none of what
    the headers announce)."""
    reader, writer = await _send(url, head, body)
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    data = await reader.readexactly(length)
    writer.close()
    return status, json.loads(data)


async def test_a_50_mb_body_is_refused_before_it_is_read(stack, swarm) -> None:
    url = f"{stack.base_url}/chat/completions"
    async with swarm.episode("big", models=["policy"], heartbeat_s=0) as ep:
        auth = {"Authorization": f"Bearer {ep.token()}", "Content-Type": "application/json"}
        # Only the headers are sent: a reply proves the gateway never waited for the 50 MB.
        status, body = await _raw_post(url, {**auth, "Content-Length": str(50_000_000)})
        assert status == 413 and body["error"]["code"] == "request_too_large"
        assert "50000000" in body["error"]["message"]

        async def chunks():  # no Content-Length: refused once what arrived passes the limit
            for _ in range(50):
                yield b" " * 1_000_000

        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(url, content=chunks(), headers=auth)
            assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
            assert (await http.get(stack.base_url.removesuffix("/v1") + "/health")).status_code == 200
        ok = await ep.openai().chat.completions.create(model="policy", messages=MSGS, max_tokens=4)
    assert ok.choices[0].message.role == "assistant"


async def test_health_answers_while_a_large_prompt_is_tokenized(stack, swarm, monkeypatch) -> None:
    builder = stack.gateway.gateway.models["policy"].builder
    tokenizing, health_answered = threading.Event(), threading.Event()
    released: list[bool] = []
    encode = builder.encode

    def held_encode(text: str) -> list[int]:
        tokenizing.set()
        # Held until /health has answered. On the event loop this would block that very answer,
        # and only the timeout would release it.
        released.append(health_answered.wait(10))
        return encode(text)

    monkeypatch.setattr(builder, "encode", held_encode)
    big = [{"role": "user", "content": "word " * 200_000}]  # ~1 MB: allowed, and over the context
    async with swarm.episode("slow", models=["policy"], heartbeat_s=0) as ep:
        call = asyncio.create_task(
            ep.openai(max_retries=0).chat.completions.create(model="policy", messages=big)
        )
        assert await asyncio.to_thread(tokenizing.wait, 30)
        async with httpx.AsyncClient(timeout=30) as http:
            health = await http.get(stack.base_url.removesuffix("/v1") + "/health")
        health_answered.set()
        with pytest.raises(openai.BadRequestError) as err:
            await call
    assert health.status_code == 200 and released == [True]
    assert err.value.code == "context_length_exceeded"


async def test_out_of_range_parameters_are_400s_and_the_connection_survives(
    stack, swarm, swarm_nats: NatsServer
) -> None:
    url = f"{stack.base_url}/chat/completions"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"seed": 2**70}, "seed"),  # the probe: was a 500 and a dropped connection
        ({"seed": -1}, "seed"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"temperature": float("nan")}, "temperature"),  # JSON's NaN, as Python's json writes it
        ({"top_p": float("inf")}, "top_p"),
        ({"top_k": 0}, "top_k"),
    ]
    async with swarm.episode("params", models=["policy"], heartbeat_s=0) as ep:
        headers = {"Authorization": f"Bearer {ep.token()}"}
        async with httpx.AsyncClient(timeout=30) as http:
            ports = set()
            for over, param in bad:
                body = json.dumps({"model": "policy", "messages": MSGS, **over})  # NaN, Infinity: as written
                r = await http.post(url, content=body, headers=headers)
                assert r.status_code == 400 and r.json()["error"]["param"] == param, (over, r.text)
                assert r.headers.get("connection") != "close"
                ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            r = await http.post(
                url, json={"model": "policy", "messages": MSGS, "max_tokens": 4}, headers=headers
            )
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
        assert r.status_code == 200 and len(ports) == 1  # one connection served them all
        nc = await nats.connect(**swarm_nats.agent.nats_options())
        request = {"model": "policy", "messages": MSGS, "seed": 2**70}
        reply = await nc.request(
            S.llm_subject("policy"),
            json.dumps({"api_key": ep.token(), "request": request}).encode(),
            timeout=30,
        )
        await nc.close()
    assert json.loads(reply.data)["status"] == 400
    assert len(await llm_events(stack.nats, ep.episode_id)) == 1  # only the good call was recorded


async def test_no_token_request_gets_a_token_beyond_the_max_lifetime(stack, swarm) -> None:
    with pytest.raises(SwarmError, match="finite"):  # the probe: NaN made a token that never expires
        await swarm.episode("nan", models=["policy"], token_ttl_s=math.nan, heartbeat_s=0).begin()
    longest = stack.gateway.cfg.token_ttl_max_s
    for ttl in (math.inf, 1e12, -5.0, 0.0):
        try:
            ep = await swarm.episode("ttl", models=["policy"], token_ttl_s=ttl, heartbeat_s=0).begin()
        except SwarmError as exc:  # refused outright (`tokens.check_ttl`)
            assert "ttl_s" in str(exc)
            continue
        try:  # or (the gateway's older rule) capped at the longest lifetime
            claims = verify(stack.gateway.gateway.secret, ep.token())
            assert claims.expires_at <= time.time() + longest, ttl
        except TokenError as exc:
            assert exc.code == "expired", ttl
        await ep.end()


async def test_a_client_gone_mid_body_is_one_log_line_not_a_traceback(stack, swarm, caplog) -> None:
    """A client killed while it sends its request (the chaos benchmark's SIGKILLs) is a client gone,
    not a server error: before, uvicorn logged "Exception in ASGI application" with a traceback."""
    async with swarm.episode("gone", models=["policy"], heartbeat_s=0) as ep:
        head = {
            "Authorization": f"Bearer {ep.token()}",
            "Content-Type": "application/json",
            "Content-Length": "1000",
        }
        caplog.set_level(logging.INFO)
        _, writer = await _send(f"{stack.base_url}/chat/completions", head, b'{"model": "policy", ')
        await asyncio.sleep(0.2)
        writer.transport.abort()  # gone, as a SIGKILLed process's socket
        for _ in range(100):
            if any("left before its request" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        ok = await ep.openai().chat.completions.create(model="policy", messages=MSGS, max_tokens=4)
    assert ok.choices[0].message.role == "assistant"
    said = [r.getMessage() for r in caplog.records]
    assert any("left before its request" in m for m in said), said[-20:]
    assert not [r for r in caplog.records if r.exc_info or "Exception in ASGI" in r.getMessage()], said[-20:]
