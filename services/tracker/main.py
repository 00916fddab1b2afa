"""`swarmrl serve tracker`: export every metric of the swarm to TensorBoard, W&B and MLflow files."""

from __future__ import annotations

from swarmrl.core.config import SwarmConfigError, parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.tracker.config import TrackerConfig, check_installed


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(TrackerConfig, argv, "swarmrl serve tracker")
    try:
        if not cfg.track:
            raise SwarmConfigError("nothing to track: --track tensorboard,wandb,mlflow (any of them)")
        check_installed(cfg.track)
    except SwarmConfigError as exc:
        raise SystemExit(f"swarmrl serve tracker: {exc}") from None
    setup_logging("tracker", cfg.log_level)
    # Imported here so `--help` stays fast (nats, and the trackers' libraries when it starts).
    from swarmrl.services.tracker.service import run

    aio.run(run(cfg))
    return 0
