"""Configuration of `swarmrl serve engine` (flags `--kebab-case`, env `SWARMRL_<FIELD>`)."""

from __future__ import annotations

from typing import Literal

from swarmrl.core.config import ServiceConfig


class EngineConfig(ServiceConfig):
    model: str = "tiny"
    """Model name: the key this engine watches in KV `swarm-models` and the name agents ask for."""
    model_path: str = ""
    """HF model directory to serve at start (required; `swarmrl up` passes the model's resolved
    base; `swarmrl bootstrap-model` builds the default tiny one and prints its directory)."""
    host: str = "127.0.0.1"
    """Interface the HTTP API listens on (embedded backend and launched SGLang)."""
    port: int = 30000
    """HTTP port of the engine API (SGLang's default port)."""
    backend: Literal["embedded", "sglang"] = "embedded"
    """`embedded`: the CPU torch engine in this process. `sglang`: a real SGLang server (GPU)."""
    sglang_url: str = ""
    """With backend=sglang: URL of an SGLang server already running; empty: launch one here."""
    sglang_args: str = ""
    """Extra flags for `sglang.launch_server`, space-separated (e.g. `--tp-size 2 --mem-fraction-static 0.8`)."""
    sglang_start_timeout_s: float = 900.0
    """How long a launched SGLang server may take to become healthy (model load, CUDA graphs)."""
    max_batch: int = 16
    """Embedded backend: most requests decoded together in one batch."""
    device: str = "cpu"
    """Embedded backend: torch device (`cpu`, `cuda`, `cuda:1`)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Embedded backend: dtype the model runs in."""
    context_length: int = 0
    """Embedded backend: most tokens (prompt + output) per request; 0: the model's max_position_embeddings."""
    torch_threads: int = 0
    """Embedded backend: torch intra-op threads; 0 keeps torch's default (one per core). On a machine
    shared with the trainer, 1 avoids thread oversubscription (5-15x faster decoding when overloaded)."""
    seed: int = 0
    """Embedded backend: seed of the sampler for requests without their own `sampling_seed`."""
    weight_version: int = 0
    """Embedded backend: version reported for the weights loaded at start, until the first reload from KV
    (a launched SGLang server reports its own, `default`, until then)."""
