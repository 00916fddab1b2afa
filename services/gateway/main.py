"""`swarmrl serve gateway`: the OpenAI-compatible endpoint with token-exact capture."""

from __future__ import annotations

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.gateway.config import GatewayConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(GatewayConfig, argv, "swarmrl serve gateway")
    setup_logging("gateway", cfg.log_level)
    # Imported here so `--help` stays fast (fastapi, uvicorn and nats load only to run).
    from swarmrl.services.gateway.service import run

    aio.run(run(cfg))
    return 0
