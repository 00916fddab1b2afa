"""Entry of `swarmrl serve trainer`: parse the config, set up logging, run the trainer of one model.

Under `accelerate launch` every process runs this; process 0 talks to NATS, the others train its shards.
"""

from __future__ import annotations

import asyncio
import signal

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.trainer.config import TrainerConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(TrainerConfig, argv, prog="swarmrl serve trainer")
    setup_logging("trainer", cfg.log_level)
    from swarmrl.services.trainer.service import Trainer  # torch/transformers: only once the flags parse

    async def run() -> None:
        trainer = Trainer(cfg)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # finish the current step, nak held samples, exit
            loop.add_signal_handler(sig, trainer.stop)
        await trainer.run()

    aio.run(run())
    return 0
