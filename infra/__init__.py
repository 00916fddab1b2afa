"""Deployment material: NATS server configs (single node, 3-node cluster, per-role accounts),
Accelerate configs, and the launcher `swarmrl` uses for its embedded NATS server."""

from pathlib import Path

NATS_CONF_DIR = Path(__file__).resolve().parent / "nats"
