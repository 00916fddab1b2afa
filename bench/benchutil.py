"""Shared by the benchmark scripts: the machine a result was measured on, and result writing."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """CPU, cores, RAM, OS, Python, torch, nats-server, load average and date of this run."""
    from swarmrl.infra.nats_server import nats_server_binary

    def first(path: str, prefix: str) -> str:
        return next(
            ln.split(":", 1)[1].strip() for ln in Path(path).read_text().splitlines() if ln.startswith(prefix)
        )

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    nats = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "ram_gib": round(int(first("/proc/meminfo", "MemTotal").split()[0]) / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch_version,
        "nats_server": nats,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def write_json(name: str, result: dict[str, Any], out: Path = RESULTS) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
