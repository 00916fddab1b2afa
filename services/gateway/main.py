"""`swarmrl serve gateway`: the OpenAI-compatible endpoint with token-exact capture."""

from __future__ import annotations

import asyncio
import signal

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.gateway.config import GatewayConfig


async def run(cfg: GatewayConfig) -> None:
    from swarmrl.services.common import bus
    from swarmrl.services.gateway.service import GatewayService, load_models

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    nc = await bus.connect(cfg.nats, "gateway")
    service = GatewayService(cfg, nc, await load_models(cfg))
    try:
        await service.run(stop)
    finally:
        await bus.close(nc, drain=True)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(GatewayConfig, argv, "swarmrl serve gateway")
    setup_logging("gateway", cfg.log_level)
    aio.run(run(cfg))
    return 0
