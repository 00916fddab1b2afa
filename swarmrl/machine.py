"""The machine a measurement was taken on (benchmarks and run reports note it with their numbers)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """CPU, cores, RAM, OS, Python, torch, nats-server, load average and date of this run."""
    from swarmrl.infra.nats_server import nats_server_binary

    def first(path: str, prefix: str) -> str:
        return next(
            ln.split(":", 1)[1].strip() for ln in Path(path).read_text().splitlines() if ln.startswith(prefix)
        )

    try:
        import torch

        torch_version = str(torch.__version__)
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


def describe(info: dict[str, Any] | None = None) -> str:
    """One line: CPU, cores, RAM, torch, load average."""
    m = info or machine()
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB, torch {m['torch']}, "
        f"load average {m['load_average']}"
    )
