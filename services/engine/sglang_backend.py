"""Launches a real SGLang server (`python -m sglang.launch_server`) as a subprocess, for GPUs.

Consumes: a model path and launch flags. Publishes: SGLang's native HTTP API on `url`, which
`EngineClient` drives exactly like the embedded engine. sglang itself is never imported here: it
runs in its own process and is only looked up (so this module imports on machines without it).
Needs the optional extra: `pip install 'swarmrl[gpu]'`. Launch flags checked against
sgl-project/sglang 0.5.x `server_args.py` (`--model-path`, `--host`, `--port`, `--log-level`,
`--weight-version`).

Streaming: the server keeps SGLang's default stream (`incremental_streaming_output` off: every event
of a `"stream": true` `/generate` is cumulative), the format the embedded engine speaks too (see
`server.py`); `EngineClient.generate_stream` also reads the incremental one, should `extra_args`
pass `--incremental-streaming-output`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

log = logging.getLogger("swarmrl.engine.sglang")


class SGLangServer:
    """One `sglang.launch_server` process group: `start()` waits for /health, `stop()` ends it."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 30000,
        extra_args: Sequence[str] = (),
        log_path: str | Path | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.host, self.port = host, port
        self.extra_args = list(extra_args)
        self.log_path = Path(log_path) if log_path else Path(f"sglang-{port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path,
            "--host", self.host,
            "--port", str(self.port),
            "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 600.0) -> SGLangServer:
        """Launch and block until /health answers 200; RuntimeError (with the log tail) if it dies."""
        if importlib.util.find_spec("sglang") is None:
            raise RuntimeError(
                "the sglang backend needs SGLang: install the GPU extra, pip install 'swarmrl[gpu]'"
            )
        cmd = self.command()
        log.info("launching %s (log: %s)", " ".join(cmd), self.log_path)
        with open(self.log_path, "ab") as out:
            # own session: SGLang forks scheduler/detokenizer processes; stop() ends the whole group
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang exited with code {self.proc.returncode}:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    log.info("sglang ready at %s", self.url)
                    return self
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"sglang not healthy at {self.url} after {timeout}s:\n{self._log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it if it outlives `timeout`."""
        if self.proc is None:
            return
        # start_new_session made the server a group leader: its pgid is its pid, even after it exits
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("sglang did not stop in %ss; killing its process group", timeout)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
