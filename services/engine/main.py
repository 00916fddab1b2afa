"""`swarmrl serve engine`: serve one model over SGLang's native HTTP API and follow its weight versions
(`service.py`)."""

from __future__ import annotations

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.engine.config import EngineConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(EngineConfig, argv, "swarmrl serve engine")
    if not cfg.model_path and not cfg.server_url:
        raise SystemExit(
            "swarmrl serve engine: --model-path is required (an HF model directory; "
            "`swarmrl bootstrap-model` builds the default tiny model and prints where)"
        )
    setup_logging("engine", cfg.log_level)
    # imported here so that `--help` stays fast
    from swarmrl.services.engine.service import run

    aio.run(run(cfg))
    return 0
