"""Gateway service: the HTTP server (`app.py`) and NATS responders in one asyncio loop.

Answers, in queue group `gateway`: token requests on `swarm.auth.token.<client>` (msgpack; after the
agent limits, admission control and task mixing) and chat completions on `swarm.llm.<model>` (JSON
`{"api_key", "request"}` -> `{"response"}` or `{"error", "status"}`; never streamed), and frees episode
slots on `end` and `abort` events. Publishes one `llm` event per completion to
`swarm.ep.<owner>.<episode_id>.llm` (Nats-Msg-Id = event.msg_id).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import time
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from swarmrl.schemas import LlmEvent, TokenReply, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.http import serve_in_loop
from swarmrl.services.common.retry import backoff
from swarmrl.services.common.tasks import on_signals
from swarmrl.services.gateway.admission import Admission, GroupBook
from swarmrl.services.gateway.app import create_app
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.core import Gateway, ModelHandle
from swarmrl.services.gateway.episodes import SharedCalls, SharedEpisodes
from swarmrl.services.gateway.errors import ApiError, check_size, server_error
from swarmrl.services.gateway.grants import check_task, check_token_request
from swarmrl.services.gateway.limits import AgentLimits
from swarmrl.services.gateway.mixing import TaskMixer, parse_weights
from swarmrl.services.gateway.pool import EnginePool
from swarmrl.services.gateway.tokens import Claims, check_ttl, mint

log = logging.getLogger("swarmrl.gateway")


def _pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"--{what} expects MODEL=VALUE, got {item!r}")
        out.append((S.check_token(name, "model name"), value))
    return out


async def _open_pool(urls: list[str], cfg: GatewayConfig) -> EnginePool:
    """The engines of one model, once the first answers; one not answering 30 s later starts down."""
    from swarmrl.services.engine.client import open_engine

    # alone, the engine's client rides out restarts; in a pool, the pool does
    kw: dict[str, Any] = {"timeout": cfg.request_timeout_s, "max_inflight": cfg.engine_max_inflight}
    kw |= {"retry_s": cfg.engine_retry_s} if len(urls) == 1 else {"retries": 2}
    opening = {url: asyncio.create_task(open_engine(url, timeout_s=600, **kw)) for url in urls}
    done, _ = await asyncio.wait(opening.values(), return_when=asyncio.FIRST_COMPLETED)
    first = next(iter(done)).result()  # none answered in 600 s: the gateway cannot start
    backend = "vllm" if type(first).__name__ == "VLLMClient" else "sglang"
    await asyncio.wait(opening.values(), timeout=30)
    members, late = [], []
    for url, task in opening.items():
        if task.done() and task.exception() is None:
            members.append(task.result())
        else:
            task.cancel()
            members.append(await open_engine(url, backend=backend, wait=False, **kw))
            late.append(url)
    pool = EnginePool(members, slack=cfg.engine_slack, retry_s=cfg.engine_retry_s)
    for url in late:  # a call tries it again after down_s
        pool.mark_down(url, RuntimeError("not ready at the gateway's start"))
    return pool


async def load_models(cfg: GatewayConfig) -> dict[str, ModelHandle]:
    from transformers import AutoConfig, AutoTokenizer

    engines: dict[str, list[str]] = {}
    for name, url in _pairs(cfg.engine, "engine"):
        engines.setdefault(name, []).append(url)
    tokenizers = dict(_pairs(cfg.tokenizer, "tokenizer"))
    if not engines:
        raise SystemExit("the gateway needs at least one --engine MODEL=URL")
    options = ("tool-parser", "reasoning-parser", "tool-prompt")  # ModelHandle's fields, in order
    named = {what: dict(_pairs(getattr(cfg, what.replace("-", "_")), what)) for what in options}
    for what, models in {**named, "lora": cfg.lora}.items():
        if unknown := sorted(set(models) - set(engines)):
            raise SystemExit(f"--{what} names {unknown}, which have no --engine; models: {sorted(engines)}")
    handles = {}
    for name, urls in engines.items():
        pool = await _open_pool(urls, cfg)
        path = tokenizers.get(name) or (await pool.first.model_info()).get("tokenizer_path")
        # after model_info, which vLLM would refuse for an adapter not loaded yet
        if name in cfg.lora:
            for member in pool.members.values():
                member.adapter = name
        tok = AutoTokenizer.from_pretrained(path)
        ctx = int(
            getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 0) or tok.model_max_length
        )
        handles[name] = handle = ModelHandle(
            name, tok, pool, ctx, *(named[w].get(name, "auto") for w in options)
        )
        log.info(
            "model=%s engines=%s tokenizer=%s context=%d tools=%s (%s) reasoning=%s",
            name, urls, path, ctx, handle.fmt.tools,
            "the gateway's Hermes prompt" if handle.builder.hermes else "the chat template", handle.fmt.reasoning,
        )  # fmt: skip
    return handles


LLM_PUBLISH_S = 60.0
"""How long a completion retries its llm event's publish: past a partition of tens of seconds
(`bench/results/partitions.md`), inside the duplicate window, so a retry is never stored twice."""


class GatewayService:
    def __init__(self, cfg: GatewayConfig, nc: NATS, models: dict[str, ModelHandle]) -> None:
        self.cfg, self.nc, self.js = cfg, nc, nc.jetstream()
        secret = (cfg.secret or secrets.token_urlsafe(32)).encode()
        self.limits = AgentLimits(
            cfg.agent_rate, cfg.agent_burst, cfg.agent_max_episodes, idle_s=cfg.agent_episode_idle_s
        )
        self.gateway = Gateway(
            models, secret, self.publish_llm, cfg.default_max_tokens, cfg.history_episodes, self.limits
        )
        if not cfg.port:
            with socket.socket() as s:
                s.bind((cfg.host, 0))
                cfg.port = s.getsockname()[1]
        self.base_url = cfg.public_url or f"http://{cfg.host}:{cfg.port}/v1"
        weights = parse_weights(cfg.task_weight)
        self.mixer = TaskMixer(weights, slack=cfg.mix_slack, window_s=cfg.mix_window_s) if weights else None
        if self.mixer is not None:
            log.info("task mixing weights=%s slack=%s window_s=%s", weights, cfg.mix_slack, cfg.mix_window_s)
        self.admission = Admission(self.js, cfg.max_backlog, GroupBook(self.js, self.mixer))
        self.episodes = SharedEpisodes(self.js, self.limits, self.admission.groups.gateway)
        self.calls = SharedCalls(nc, self.limits, self.admission.groups.gateway)

    async def publish_llm(self, event: LlmEvent) -> None:
        """Publish a call's llm event durably, retried through NATS failures for `LLM_PUBLISH_S`."""
        subject, headers = S.episode_subject(event.episode_id, "llm"), {"Nats-Msg-Id": event.msg_id}
        payload = encode(event)
        await backoff(lambda: self.js.publish(subject, payload, headers=headers), seconds=LLM_PUBLISH_S)

    async def on_token(self, msg: Msg) -> None:
        try:
            grant = check_token_request(msg.data, self.gateway.models)
            req = grant.request
            owner = msg.subject.rsplit(".", 1)[-1]  # the server lets a client ask only on its own
            if S.episode_owner(req.episode_id) != owner:
                raise ValueError(
                    f"not_owner: client {owner!r} may not get tokens for episode {req.episode_id!r}"
                )
            ttl_s = check_ttl(req.ttl_s, self.cfg.token_ttl_max_s)  # before admission counts the group
            check_task(req.task, owner, self.cfg.tasks, self.cfg.own_tasks, self.cfg.outside_tasks)
            if self.mixer is not None and not req.eval:
                self.mixer.check(req.task)  # an unweighted task would slip past the mix
            held = self.limits.find(owner, req.episode_id) is not None  # asking again (another agent's token)
            wait = await self.episodes.take(owner, req.episode_id, time.monotonic())  # before admission
            if not wait:
                wait = await self.admission.check(
                    list(grant.models), req.group_key, req.eval, req.task, req.episode_id
                )
                if wait and not held:  # it will ask again: its slot waits with it no longer
                    await self.episodes.give_back(owner, req.episode_id)
            if wait > 0:
                await msg.respond(encode(TokenReply(retry_after_s=wait), exclude_none=True))
                return
            expires = time.time() + ttl_s
            tokens = {
                agent: mint(
                    self.gateway.secret,
                    Claims(req.episode_id, agent, models, expires, req.client_id, req.client_version),
                )
                for agent, models in grant.agent_models.items()
            }
            answer = TokenReply(tokens=tokens, base_url=self.base_url)
        except Exception as exc:  # bad token request: answer with the reason, never crash
            log.warning("token request refused: %s", exc)
            answer = TokenReply(error=str(exc))
        await msg.respond(encode(answer, exclude_none=True))

    async def on_episode_closed(self, msg: Msg) -> None:
        """An episode's `end` or `abort` event (as published to JetStream): its identity may open another."""
        try:
            episode_id, _ = S.parse_episode_subject(msg.subject)  # NotOwnerError is a ValueError
        except ValueError:
            return
        await self.episodes.give_back(S.episode_owner(episode_id), episode_id)

    async def on_llm(self, msg: Msg) -> None:
        try:
            check_size(len(msg.data), self.cfg.max_request_bytes)
            req = await asyncio.to_thread(json.loads, msg.data)  # up to max_request_bytes: off the loop
            call = await self.gateway.prepare(req.get("request"), req.get("api_key"))
            answer: dict[str, Any] = {"response": (await self.gateway.generate(call)).response}
        except Exception as exc:  # any failure becomes an error reply; the requester is never left hanging
            err = exc if isinstance(exc, ApiError) else server_error(exc)
            if err is not exc:
                log.exception("nats completion failed")
            answer = {**err.body(), "status": err.status}
            if err.retry_after_s is not None:
                answer["retry_after_s"] = err.retry_after_s
        await msg.respond(json.dumps(answer).encode())

    async def start_nats(self) -> None:
        """Create streams if needed and answer token and completion requests."""
        await bus.ensure_streams(self.js)
        if self.admission.active:
            await self.admission.groups.start()
        await self.nc.subscribe(S.TOKEN_REQUESTS, queue="gateway", cb=self.on_token)
        if self.calls.active:
            await self.calls.start()
        if self.episodes.active:
            await self.episodes.start()
            for kind in ("end", "abort"):
                await self.nc.subscribe(
                    S.episode_filter("*", kind), queue="gateway", cb=self.on_episode_closed
                )
        for name in self.gateway.models:
            await self.nc.subscribe(S.llm_subject(name), queue="gateway", cb=self.on_llm)

    async def run(self, stop: asyncio.Event) -> None:
        await self.start_nats()
        server, task = await serve_in_loop(
            create_app(self.gateway, self.cfg.max_request_bytes), self.cfg.host, self.cfg.port
        )
        log.info("gateway ready url=%s models=%s", self.base_url, sorted(self.gateway.models))
        await stop.wait()
        server.should_exit = True
        await task
        await self.admission.groups.stop()
        await self.episodes.stop()
        await self.calls.stop()


async def run(cfg: GatewayConfig) -> None:
    """`swarmrl serve gateway`: the gateway on its own connection, until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    on_signals(stop.set)
    nc = await bus.connect(cfg.nats, "gateway")
    service = GatewayService(cfg, nc, await load_models(cfg))
    try:
        await service.run(stop)
    finally:
        await bus.close(nc, drain=True)
