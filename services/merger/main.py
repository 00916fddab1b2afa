"""`swarmrl serve merger`: parse the config, set up logging, run the merger until SIGTERM/SIGINT."""

from __future__ import annotations

from swarmrl.core.config import parse_config, plain_servers
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.common.tasks import on_signals
from swarmrl.services.merger.config import MergerConfig


async def _serve(cfg: MergerConfig) -> None:
    from swarmrl.services.merger.service import Merger  # lazy: keeps `--help` fast

    merger = Merger(cfg)
    on_signals(merger.request_stop)
    await merger.run()


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(MergerConfig, argv, prog="swarmrl serve merger")
    log = setup_logging("merger", cfg.log_level)
    log.info(
        "starting: nats=%s episode_timeout_s=%g", ",".join(plain_servers(cfg.nats)), cfg.episode_timeout_s
    )
    aio.run(_serve(cfg))
    return 0
