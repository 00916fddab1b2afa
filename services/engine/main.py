"""`swarmrl serve engine`: serve one model over SGLang's native HTTP API and follow its weight versions.

Backends: `embedded` (the CPU torch engine in this process), `sglang` or `vllm` (a launched or
external server). With `--nats ""` no weight watcher runs. See `service.py` for what runs.
"""

from __future__ import annotations

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.engine.config import EngineConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(EngineConfig, argv, "swarmrl serve engine")
    if not cfg.model_path and not cfg.server_url:
        raise SystemExit(
            "swarmrl serve engine: --model-path is required (an HF model directory; `swarmrl bootstrap-model` "
            "builds the default tiny model and prints where)"
        )
    setup_logging("engine", cfg.log_level)
    # Imported here so `--help` stays fast (torch, transformers and nats load only to run).
    from swarmrl.services.engine.service import run

    aio.run(run(cfg))
    return 0
