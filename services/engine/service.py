"""The engine service: an SGLang-API backend plus the weight watcher, in one asyncio loop.

Consumes: KV `swarm-models[<model>]` (via `WeightWatcher`, when `--nats` is set). Publishes: the
SGLang native HTTP API on `--host:--port` (embedded backend, or a launched SGLang server), or
drives an external SGLang server at `--sglang-url`. Stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from typing import Any

from swarmrl.services.common.tasks import Loops, serve_until_signalled
from swarmrl.services.engine.client import EngineClient
from swarmrl.services.engine.config import EngineConfig

log = logging.getLogger("swarmrl.engine")


class EngineService(Loops):
    """`start()`, then `wait()` until `request_stop()` (or a part dies), then `stop()`."""

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.url = ""
        self.client: EngineClient | None = None
        self._engine: Any = None  # EngineCore (embedded)
        self._server: Any = None  # uvicorn server (embedded)
        self._launcher: Any = None  # SGLangServer (sglang, launched here)
        self._nc: Any = None

    async def start(self) -> None:
        cfg = self.cfg
        if cfg.backend == "embedded":
            await self._start_embedded()
        elif cfg.sglang_url:
            self.url = cfg.sglang_url
        else:
            from swarmrl.services.engine.sglang_backend import SGLangServer

            if not cfg.model_path:
                raise ValueError("backend=sglang launches SGLang with --model-path; none given")
            self._launcher = SGLangServer(
                cfg.model_path, host=cfg.host, port=cfg.port, extra_args=shlex.split(cfg.sglang_args)
            )
            await asyncio.to_thread(self._launcher.start, cfg.sglang_start_timeout_s)
            self.url = self._launcher.url
        self.client = EngineClient(self.url)
        await self.client.wait_ready(timeout=cfg.sglang_start_timeout_s)
        log.info("engine %s (%s) serving at %s", cfg.model, cfg.backend, self.url)
        if cfg.nats:
            from swarmrl.services.common import bus
            from swarmrl.services.engine.weights import WeightWatcher

            self._nc = await bus.connect(cfg.nats, f"engine-{cfg.model}")
            watcher = WeightWatcher(self._nc.jetstream(), self.client, cfg.model)
            self._tasks.append(asyncio.create_task(watcher.run(self._stop), name="weight-watcher"))
        else:
            log.info("no --nats: weights are not watched")

    async def _start_embedded(self) -> None:
        import torch

        from swarmrl.services.common.http import serve_in_loop
        from swarmrl.services.engine.engine_core import EngineCore
        from swarmrl.services.engine.server import create_app

        cfg = self.cfg
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        path = cfg.model_path
        if not path:
            raise ValueError(
                "engine: no --model-path: give an HF model directory (`swarmrl bootstrap-model` builds the "
                "default tiny model and prints where)"
            )
        self._engine = await asyncio.to_thread(
            EngineCore, path, max_batch=cfg.max_batch, device=cfg.device, dtype=cfg.dtype,
            weight_version=str(cfg.weight_version), seed=cfg.seed, context_length=cfg.context_length or None,
        )  # fmt: skip
        self._server, task = await serve_in_loop(create_app(self._engine), cfg.host, cfg.port)
        self._tasks.append(task)
        self.url = f"http://{cfg.host}:{cfg.port}"

    async def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._nc is not None:
            await self._nc.close()
        if self.client is not None:
            await self.client.aclose()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.close)
        if self._launcher is not None:
            await asyncio.to_thread(self._launcher.stop)
        log.info("engine %s stopped", self.cfg.model)


async def run(cfg: EngineConfig) -> None:
    await serve_until_signalled(EngineService(cfg))
