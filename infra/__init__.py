"""Deployment material: NATS server configs (single node, 3-node cluster, per-role accounts),
Accelerate configs, and the launcher `swarmrl` uses for its embedded NATS server."""

from pathlib import Path

INFRA_DIR = Path(__file__).resolve().parent
NATS_CONF_DIR = INFRA_DIR / "nats"
ACCELERATE_CONF_DIR = INFRA_DIR / "accelerate"
