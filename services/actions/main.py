"""`swarmrl serve actions` (the scheduler with its local units) and `swarmrl serve action-worker`
(remote units of one kind, on any machine that reaches NATS)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.actions.config import ActionsConfig, WorkerConfig
from swarmrl.services.common import loop as aio


async def _serve(cfg: ActionsConfig) -> None:
    from swarmrl.services.actions.service import ActionsService  # lazy: keeps `--help` fast
    from swarmrl.services.common import bus

    nc = await bus.connect(cfg.nats, "actions")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    service = ActionsService(cfg, nc, js)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.request_stop)
    try:
        await service.run()
    finally:
        await bus.close(nc)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ActionsConfig, argv, prog="swarmrl serve actions")
    setup_logging("actions", cfg.log_level)
    aio.run(_serve(cfg))
    return 0


async def _work(cfg: WorkerConfig) -> None:
    import msgpack

    from swarmrl.schemas import subjects as S
    from swarmrl.services.actions.workers import Runner, WorkerLoop, build_manager
    from swarmrl.services.common import bus

    name = cfg.name or f"{socket.gethostname()}-{os.getpid()}"
    nc = await bus.connect(cfg.nats, f"action-worker-{name}")
    worker = WorkerLoop(
        nc.jetstream(), nc, Runner(cfg.kind, build_manager(cfg.kind, cfg), cfg), cfg.units, name
    )
    await worker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    beat = {"name": name, "kind": cfg.kind, "units": cfg.units, "period_s": cfg.heartbeat_s}
    try:
        while not stop.is_set():
            await nc.publish(S.ACTION_WORKERS_SUBJECT, msgpack.packb(beat))
            try:
                await asyncio.wait_for(stop.wait(), cfg.heartbeat_s)
            except TimeoutError:
                pass
        await nc.publish(S.ACTION_WORKERS_SUBJECT, msgpack.packb(beat | {"units": 0}))  # gone now
    finally:
        await worker.close()
        await bus.close(nc)


def worker_main(argv: list[str] | None = None) -> int:
    cfg = parse_config(WorkerConfig, argv, prog="swarmrl serve action-worker")
    setup_logging("action-worker", cfg.log_level)
    aio.run(_work(cfg))
    return 0
