"""A real SGLang server (`python -m sglang.launch_server`) launched as a subprocess, for GPUs; needs
`pip install 'swarmrl[gpu]'`. It keeps SGLang's default cumulative stream, which the embedded engine
speaks too (`EngineClient.generate_stream` also reads `--incremental-streaming-output`'s).
"""

from __future__ import annotations

import importlib.util
import sys

from swarmrl.services.engine.launched import LaunchedServer


class SGLangServer(LaunchedServer):
    """One `sglang.launch_server` process group."""

    name = "sglang"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(self.model_path),
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
