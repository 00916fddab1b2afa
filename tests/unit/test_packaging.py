"""The folder → `swarmrl.*` mapping in pyproject.toml must list every package that exists on disk."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = conf["package-dir"]
    listed = set(conf["packages"])
    on_disk = set()
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    missing = {p for p in on_disk if not any(p == q for q in listed)}
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_import_names_are_namespaced() -> None:
    import swarmrl.agents
    import swarmrl.schemas

    assert swarmrl.schemas.__name__ == "swarmrl.schemas"
    assert swarmrl.agents.__name__ == "swarmrl.agents"
