"""The embedded nats-server outlives a Ctrl-C of the terminal that runs `swarmrl up`: the signal
reaches `up`, which stops the services first and the server last (before, the server died with the
signal and the clients could not drain through it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os, signal, sys, time
from swarmrl.infra.nats_server import NatsServer

signal.signal(signal.SIGINT, lambda *_: None)  # this process (as `up` does) handles its Ctrl-C
server = NatsServer(store_dir=sys.argv[1]).start()
os.killpg(0, signal.SIGINT)  # what a terminal sends its foreground process group on Ctrl-C
time.sleep(1.5)
print("alive" if server.proc.poll() is None else f"dead {server.proc.returncode}")
server.stop()
"""


@pytest.mark.timeout(60)
def test_the_server_survives_its_parents_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.run(  # its own process group, so the Ctrl-C it sends stays there
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True, text=True, timeout=50,
        start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "alive"
