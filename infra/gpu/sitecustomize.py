"""Import `swarmrl.*` from this source tree without installing it (the GPU check's device copy).

The folders are mapped onto import names by `[tool.setuptools] package-dir` in pyproject.toml
(`swarmrl.services` is `services/`, ...), which only an install applies. Python imports
`sitecustomize` at start from the first folder of `sys.path` that has one, so
`PYTHONPATH=infra/gpu:<repo>` makes every process, subprocesses included, find the mapped
packages here. Nothing is imported until asked for. `infra/gpu/check.sh` sets that path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


class _SourceTree(importlib.abc.MetaPathFinder):
    """Finds the mapped packages (`swarmrl.services`, ...) in their folders; their submodules
    are then found by Python's own finder through each package's `__path__`."""

    def __init__(self, root: Path) -> None:
        conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
        self.folders = {name: root / folder for name, folder in conf["package-dir"].items()}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


sys.meta_path.insert(0, _SourceTree(ROOT))
