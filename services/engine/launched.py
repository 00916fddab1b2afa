"""A third-party engine server (SGLang, vLLM) run as a subprocess: start, wait for health, stop.
The engine package is never imported here (it may live in another Python), so this imports anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import ClassVar

import httpx

log = logging.getLogger("swarmrl.engine.launched")


@dataclass
class LaunchedServer:
    """One server process group serving `model_path`: `start()` waits for `GET /health` == 200,
    `stop()` ends the group."""

    name: ClassVar[str] = "engine"  # shown in logs and errors
    model_path: str | Path
    _: KW_ONLY
    host: str = "127.0.0.1"
    port: int = 30000
    extra_args: Sequence[str] = ()
    log_path: str | Path | None = None
    """The server's output; None: this process's stdout and stderr."""
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """The server's environment: this process's, plus what a subclass adds."""
        return dict(os.environ)

    def check_installed(self) -> None:
        """Raise RuntimeError saying how to install the engine, if it is missing."""

    def start(self, timeout: float = 600.0) -> LaunchedServer:
        """Launch and block until /health answers 200; RuntimeError (with the log tail) if it dies."""
        self.check_installed()
        cmd = self.command()
        log.info("launching %s (log: %s)", " ".join(cmd), self.log_path or "this process's")
        # own session: engines fork scheduler/worker processes; stop() ends the whole group
        with open(self.log_path, "ab") if self.log_path is not None else contextlib.nullcontext() as out:
            err = None if out is None else subprocess.STDOUT
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, env=self.env())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    log.info("%s ready at %s", self.name, self.url)
                    return self
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy at {self.url} after {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it if it outlives `timeout`."""
        if self.proc is None:
            return
        # start_new_session made the server a group leader: its pgid is its pid
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %ss; killing its process group", self.name, timeout)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None:
            return "(its output is in this process's log, just above)"
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
