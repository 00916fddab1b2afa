"""The engine service: an engine's HTTP API (the embedded engine's, a launched SGLang or vLLM
server's, or an external one at `--server-url`) plus, with `--nats`, a `WeightWatcher` per served
model or LoRA adapter, in one asyncio loop.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from typing import Any

from swarmrl.core.precision import resolve_dtype
from swarmrl.services.common import bus
from swarmrl.services.common.tasks import Loops, serve_until_signalled
from swarmrl.services.engine.client import EngineClient, open_engine
from swarmrl.services.engine.config import EngineConfig
from swarmrl.services.engine.launched import LaunchedServer

log = logging.getLogger("swarmrl.engine")


class EngineService(Loops):
    """`start()`, then `wait()` until `request_stop()` (or a part dies), then `stop()`."""

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.url = ""
        self.client: EngineClient | None = None
        self._engine: Any = None  # embedded: EngineCore
        self._server: Any = None  # embedded: uvicorn server
        self._launcher: LaunchedServer | None = None
        self._nc: Any = None
        self._adapter_clients: list[EngineClient] = []

    async def start(self) -> None:
        cfg = self.cfg
        if cfg.backend == "sglang" and cfg.adapters:
            raise ValueError(
                "backend=sglang does not serve trainable LoRA adapters yet (its /load_lora_adapter cannot "
                "replace a loaded adapter in place, and this path has not run on a GPU): use the embedded "
                "or vllm backend for LoRA models, or train all weights"
            )
        if cfg.backend != "embedded" and len(cfg.adapters) > 1:
            raise ValueError(
                f"backend={cfg.backend} keeps one weight version per server, so it serves one trainable "
                f"LoRA adapter, not {len(cfg.adapters)} ({cfg.adapters}): run several adapters on one base "
                "with the embedded engine, or give each model its own engine"
            )
        if not cfg.model_path and (cfg.backend == "embedded" or not cfg.server_url):
            raise ValueError(
                f"engine: backend={cfg.backend} needs --model-path here (an HF model directory; `swarmrl "
                "bootstrap-model` builds the default tiny model and prints where): only sglang and vllm "
                "with --server-url run without one"
            )
        if cfg.backend == "embedded":
            await self._start_embedded()
        elif cfg.server_url:
            self.url = cfg.server_url
        else:
            self._launcher = launcher(cfg)
            await asyncio.to_thread(self._launcher.start, cfg.server_start_timeout_s)
            self.url = self._launcher.url
        self.client = await open_engine(self.url, backend=cfg.backend, timeout_s=cfg.server_start_timeout_s)
        log.info("engine %s (%s) serving at %s", cfg.model, cfg.backend, self.url)
        if cfg.nats:
            from swarmrl.services.engine.weights import WeightWatcher

            self._nc = await bus.connect(cfg.nats, f"engine-{cfg.model}")
            if not cfg.adapters:
                watchers = [WeightWatcher(self._nc, self.client, cfg.model)]
            else:  # one per adapter, each with a client of its own that loads it
                self._adapter_clients = [type(self.client)(self.url, adapter=name) for name in cfg.adapters]
                watchers = [WeightWatcher(self._nc, c, c.adapter or "") for c in self._adapter_clients]
            for w in watchers:
                self._tasks.append(asyncio.create_task(w.run(self._stop), name=f"weight-watcher-{w.model}"))
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
        self._engine = await asyncio.to_thread(
            EngineCore, cfg.model_path, max_batch=cfg.max_batch, device=cfg.device, dtype=cfg.dtype,
            weight_version=str(cfg.weight_version), seed=cfg.seed, context_length=cfg.context_length or None,
            adapters=cfg.adapters, prefix_cache_mib=cfg.prefix_cache_mib, merge_lora=cfg.merge_lora,
        )  # fmt: skip
        self._server, task = await serve_in_loop(create_app(self._engine), cfg.host, cfg.port)
        self._tasks.append(task)
        self.url = f"http://{cfg.host}:{cfg.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        await self.finish()  # the weight watcher may wait on a NATS that is gone: cancelled after a grace
        if self._nc is not None:
            await bus.close(self._nc)
        for client in [self.client, *self._adapter_clients]:
            if client is not None:
                await client.aclose()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.close)
        if self._launcher is not None:
            await asyncio.to_thread(self._launcher.stop)
        log.info("engine %s stopped", self.cfg.model)


def launcher(cfg: EngineConfig) -> LaunchedServer:
    """The server process `cfg` asks for (backend sglang or vllm), not started yet."""
    args = shlex.split(cfg.server_args)
    if cfg.backend == "sglang":
        from swarmrl.services.engine.sglang_backend import SGLangServer

        return SGLangServer(cfg.model_path, host=cfg.host, port=cfg.port, extra_args=args)
    from swarmrl.services.engine.vllm_backend import VLLMServer

    return VLLMServer(
        cfg.model_path, served_name=cfg.model, host=cfg.host, port=cfg.port, python=cfg.vllm_python,
        extra_args=args, dtype=resolve_dtype(cfg.dtype, cfg.model_path), seed=cfg.seed,
        max_model_len=cfg.context_length, max_num_seqs=cfg.max_batch, kv_cache_gib=cfg.vllm_kv_cache_gib,
        threads=cfg.torch_threads, max_loras=len(cfg.adapters),
    )  # fmt: skip


async def run(cfg: EngineConfig) -> None:
    await serve_until_signalled(EngineService(cfg))
