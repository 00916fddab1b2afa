"""`swarmrl serve actions` (the scheduler with its local units) and `swarmrl serve action-worker`
(remote units of one kind, on any machine that reaches NATS)."""

from __future__ import annotations

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.actions.config import ActionsConfig, WorkerConfig
from swarmrl.services.common import loop as aio


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ActionsConfig, argv, prog="swarmrl serve actions")
    setup_logging("actions", cfg.log_level)
    from swarmrl.services.actions.service import run  # lazy: keeps `--help` fast

    aio.run(run(cfg))
    return 0


def worker_main(argv: list[str] | None = None) -> int:
    cfg = parse_config(WorkerConfig, argv, prog="swarmrl serve action-worker")
    setup_logging("action-worker", cfg.log_level)
    from swarmrl.services.actions.workers import run_worker

    aio.run(run_worker(cfg))
    return 0
