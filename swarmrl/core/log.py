"""The one logging setup. Services log `service=<name>` on every line; no print() in services."""

from __future__ import annotations

import logging
import os
import sys


def setup_logging(service: str, level: str | None = None) -> logging.Logger:
    level = level or os.environ.get("SWARMRL_LOG_LEVEL", "INFO")
    fmt = f"%(asctime)s %(levelname)s service={service} %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr, force=True)  # force: replace handlers
    for noisy in ("nats", "httpx", "httpx2", "openai", "uvicorn.access", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(f"swarmrl.{service}")
