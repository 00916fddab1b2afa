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
import sys
from collections.abc import Sequence
from pathlib import Path

from swarmrl.services.engine.launched import LaunchedServer


class SGLangServer(LaunchedServer):
    """One `sglang.launch_server` process group: `start()` waits for /health, `stop()` ends it."""

    name = "sglang"

    def __init__(
        self,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 30000,
        extra_args: Sequence[str] = (),
        log_path: str | Path | None = None,
    ) -> None:
        super().__init__(host=host, port=port, log_path=log_path)
        self.model_path = str(model_path)
        self.extra_args = list(extra_args)

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path,
            "--host", self.host,
            "--port", str(self.port),
            "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip

    def check_installed(self) -> None:
        if importlib.util.find_spec("sglang") is None:
            raise RuntimeError(
                "the sglang backend needs SGLang: install the GPU extra, pip install 'swarmrl[gpu]'"
            )
