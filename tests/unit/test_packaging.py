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


# import name -> distribution, where they differ
DISTRIBUTIONS = {
    "nats": "nats-py",
    "nkeys": "nats-py",
    "sglang": "sglang",
    "yaml": "pyyaml",
    "mlflow": "mlflow-skinny",
}


def test_every_imported_package_is_declared() -> None:
    """Each third-party package the shipped folders import is a dependency (or an extra's) in
    pyproject.toml, not something that happens to be installed by another package."""
    import ast
    import re
    import sys

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = conf["dependencies"] + [d for extra in conf["optional-dependencies"].values() for d in extra]
    declared = {re.split(r"[<>=\[ ;]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}
    imported: dict[str, str] = {}
    for folder in ("swarmrl", "services", "schemas", "agents", "infra"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "swarmrl":
                        imported.setdefault(top, str(path.relative_to(ROOT)))
    missing = {
        top: where
        for top, where in imported.items()
        if DISTRIBUTIONS.get(top, top).lower().replace("_", "-") not in declared
    }
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
