"""The layers: services, the wire contract, clients and infrastructure import the ground floor
(`swarmrl.core`) and each other as below, never the roof (`swarmrl.cli`, `swarmrl.up`, launch, the
supervisor, research, bootstrap). Every import counts, those inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ALLOWED = {
    "schemas": {"schemas"},
    "swarmrl/core": {"core"},
    "infra": {"core", "schemas", "infra"},
    "services": {"core", "schemas", "infra", "services"},
    # the SDK and the built-in runner: of the services, only their common pieces (below)
    "agents": {"core", "schemas", "infra", "agents", "services"},
}


def imported(path: Path) -> set[str]:
    """The `swarmrl.<X>` packages `path` imports (X), wherever in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [
                f"{node.module}.{a.name}" for a in node.names if node.module == "swarmrl"
            ]
        out |= {n.split(".")[1] for n in names if n.startswith("swarmrl.")}
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_what_is_below_it(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, layer
    wrong = {str(f.relative_to(ROOT)): sorted(bad) for f in files if (bad := imported(f) - ALLOWED[layer])}
    assert not wrong, f"{layer} imports above its layer: {wrong}"


def test_tests_import_no_benchmark_and_benchmarks_only_the_tests_support() -> None:
    """Test support lives in `tests/support`, which the benchmarks may import; a test imports a
    benchmark only to test it (`tests/unit/bench`)."""
    benchmarks = {p.stem for p in (ROOT / "bench").rglob("*.py")}

    def top_imports(path: Path) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
        return out

    tests = [p for p in (ROOT / "tests").rglob("*.py") if "tests/unit/bench" not in p.as_posix()]
    wrong = {
        str(p.relative_to(ROOT)): sorted(bad)
        for p in tests
        if (bad := {n.split(".")[0] for n in top_imports(p)} & benchmarks)
    }
    assert not wrong, f"tests importing benchmarks (move what they need into tests/support): {wrong}"
    bench = sorted((ROOT / "bench").rglob("*.py"))
    wrong = {
        str(p.relative_to(ROOT)): sorted(bad)
        for p in bench
        if (
            bad := {
                n for n in top_imports(p) if n.split(".")[0] == "tests" and not n.startswith("tests.support")
            }
        )
    }
    assert not wrong, f"benchmarks importing tests other than tests.support: {wrong}"


def test_the_agents_use_of_the_services_only_their_common_pieces() -> None:
    """No agent module reads a service's own module (its config, say): the SDK installs without them."""
    wrong = {}
    for path in sorted((ROOT / "agents").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad = [
                n
                for n in names
                if n.startswith("swarmrl.services.") and not n.startswith("swarmrl.services.common")
            ]
            if bad:
                wrong.setdefault(str(path.relative_to(ROOT)), []).extend(bad)
    assert not wrong, f"agents importing a service's own modules: {wrong}"
