"""Shared by the benchmark scripts: the machine a result was measured on, and result writing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarmrl.machine import machine

__all__ = ["RESULTS", "machine", "write_json"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_json(name: str, result: dict[str, Any], out: Path = RESULTS) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
