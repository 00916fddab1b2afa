#!/usr/bin/env bash
# Fill .whl/ with the wheels of infra/gpu/wheels.txt for the GPU machine (CPython 3.12, x86-64
# Linux), from this machine's package index: `bash infra/gpu/wheels.sh`. nkeys publishes only
# an sdist; it is pure Python, so its wheel is built here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .whl
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
grep -Ev '^\s*(#|$)' infra/gpu/wheels.txt | while read -r spec; do
    if [[ $spec == nkeys==* ]]; then
        python3 -m pip wheel -q --no-deps --no-binary=:all: -w .whl "$spec"
    else
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp "${platforms[@]}" -d .whl "$spec"
    fi
done
du -sh .whl
