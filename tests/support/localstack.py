"""A real generation stack in one process: embedded engine (HTTP) + gateway (HTTP + NATS responders).

For tests and benchmarks (which import it from here), which need the real components without the
process supervision of `up`. Not part of the package.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import LlmEvent, decode_event
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.server import create_app
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.service import GatewayService, load_models


@dataclass
class Stack:
    nats: NatsServer
    engine: EngineCore
    engine_url: str
    gateway: GatewayService
    engines: dict[str, EngineCore]
    """Every model's engine, by model name (`engine` is the first one's)."""
    engine_servers: dict[str, BackgroundServer]
    """Every engine's HTTP server, by model name (a test stops one to fail the engine)."""

    @property
    def base_url(self) -> str:
        return self.gateway.base_url


@contextmanager
def embedded_engine(model_dir: Path, **engine_args: object) -> Iterator[tuple[EngineCore, str]]:
    """The embedded engine on `model_dir` served over HTTP on a random port: (core, base URL)."""
    core = EngineCore(model_dir, **engine_args)  # type: ignore[arg-type]
    server = BackgroundServer(create_app(core)).start()
    try:
        yield core, server.url
    finally:
        server.stop()
        core.close()


@asynccontextmanager
async def generation_stack(
    server: NatsServer,
    model_dir: Path,
    model: str = "policy",
    more: dict[str, Path] | None = None,
    pool: int = 1,
    **gateway: Any,
) -> AsyncIterator[Stack]:
    """Engine(s) + gateway on `server`: `model` served from `model_dir` by `pool` engines (keyed
    `model`, `model#1`, ...), plus one engine per entry of `more` (model name -> model dir), all
    behind one gateway that routes by model name; `gateway`: more `GatewayConfig` fields."""
    dirs = {model: model_dir, **{f"{model}#{i}": model_dir for i in range(1, pool)}, **(more or {})}
    engines = {name: EngineCore(path, max_batch=16) for name, path in dirs.items()}
    https = {name: BackgroundServer(create_app(engine)).start() for name, engine in engines.items()}
    cfg = GatewayConfig(
        nats=server.url("gateway"),  # the gateway's own NATS user: its permissions are exercised too
        port=0,
        engine=[f"{name.split('#')[0]}={http.url}" for name, http in https.items()],
        **gateway,
    )
    nc = await bus.connect(cfg.nats, "test-gateway")
    service = GatewayService(cfg, nc, await load_models(cfg))
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    async with httpx.AsyncClient() as client:
        for _ in range(200):
            try:
                if (await client.get(service.base_url.removesuffix("/v1") + "/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    try:
        yield Stack(server, engines[model], https[model].url, service, engines, https)
    finally:
        stop.set()
        await task
        await nc.close()
        for http in https.values():
            http.stop()  # idempotent: a test may have stopped it
        for engine in engines.values():
            engine.close()


async def llm_events(server: NatsServer, episode_id: str = "*") -> list[LlmEvent]:
    """Every llm event on the EPISODES stream (of one episode, or all), in stream order."""
    nc = await nats.connect(server.service_url)
    sub = await nc.jetstream().subscribe(
        S.episode_filter(episode_id, "llm"),
        ordered_consumer=True,
    )
    out: list[LlmEvent] = []
    while True:
        try:
            msg = await sub.next_msg(timeout=0.5)
        except nats.errors.TimeoutError:
            break
        ev = decode_event(msg.data)
        assert isinstance(ev, LlmEvent)
        out.append(ev)
    await nc.close()
    return out
