"""Shared by the benchmark scripts: the machine a result was measured on, and result writing."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from swarmrl.machine import machine

__all__ = ["RESULTS", "baseline_tree", "machine", "write_json"]

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]


def write_json(name: str, result: dict[str, Any], out: Path = RESULTS) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def baseline_tree(ref: str, tmp: Path) -> Path:
    """An import tree of commit `ref` for PYTHONPATH: its `swarmrl/`, with the folders its pyproject
    maps into `swarmrl.*` (`package-dir`) linked in."""
    src, tree = tmp / "baseline-src", tmp / "baseline"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    package_dir = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.copytree(src / package_dir["swarmrl"], tree / "swarmrl")
    for package, folder in package_dir.items():
        if package != "swarmrl":
            (tree / Path(*package.split("."))).symlink_to(src / folder, target_is_directory=True)
    return tree
