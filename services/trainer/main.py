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
    from swarmrl.services.trainer import service  # torch/transformers: only once the flags parse

    async def run() -> None:
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):  # finish the current step, nak held samples, exit
            asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
        learner, checkpoint = await service.load(cfg)
        if not learner.is_main:  # processes 1..N-1 of `accelerate launch` train what process 0 sends
            return await asyncio.to_thread(service.follow, cfg, learner)
        lead = None
        if cfg.replica:  # one of several: the model loaded, wait for the lead
            if (lead := await service.standby(cfg, stopping)) is None:
                return
            checkpoint = await service.catch_up(cfg, learner, checkpoint)
        await (await service.Trainer.connect(cfg, learner, checkpoint, stopping, lead)).run()

    aio.run(run())
    return 0
