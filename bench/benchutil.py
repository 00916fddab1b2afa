"""Shared by the benchmark scripts: the machine a result was measured on, and result writing.

Imported before anything of the tests: it puts the repository on the import path, so a benchmark
imports the tests' support (`tests.support`: the in-process stack, the scheduler's simulator, stream
reads); the tests never import a benchmark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from swarmrl.machine import machine

__all__ = ["REPO", "RESULTS", "baseline_tree", "machine", "proc_cpu_s", "write_json"]

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def proc_cpu_s(pid: int, waited_children: bool = False) -> float:
    """CPU seconds (user + system) of process `pid`, from /proc (Linux, as swarmrl); with
    `waited_children` also those of its children it has waited for. OSError once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11 : 15 if waited_children else 13]) / CLK_TCK
