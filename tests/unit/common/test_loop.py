"""The services' event loop: uvloop where it is installed (a dependency on Linux and macOS)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest

from swarmrl.services.common import loop as aio


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not a dependency on Windows")
def test_services_run_on_uvloop() -> None:
    assert importlib.util.find_spec("uvloop") is not None, "uvloop is a dependency on this platform"
    assert aio.run(_loop_module()).startswith("uvloop")


def test_run_returns_the_result_and_closes_its_loop() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> int:
        seen.append(asyncio.get_running_loop())
        return 42

    assert aio.run(main()) == 42
    assert seen[0].is_closed()


def test_without_uvloop_it_falls_back_to_asyncio() -> None:
    # A fresh interpreter where importing uvloop fails, as on a platform without it.
    code = (
        "import sys; sys.modules['uvloop'] = None\n"
        "import asyncio\n"
        "from swarmrl.services.common import loop as aio\n"
        "async def main():\n"
        "    return type(asyncio.get_running_loop()).__module__\n"
        "print(aio.run(main()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("asyncio")


def test_every_service_main_runs_on_it() -> None:
    # The long-running processes `swarmrl up` starts all enter through `aio.run`, none through
    # `asyncio.run` (which would silently keep asyncio's slower loop).
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    mains = [*sorted((root / "services").glob("*/main.py")), root / "agents" / "runner.py"]
    assert len(mains) >= 8
    for path in mains:
        text = path.read_text()
        assert "asyncio.run(" not in text, f"{path.relative_to(root)} calls asyncio.run"
        assert "aio.run(" in text, f"{path.relative_to(root)} does not run on services.common.loop"
