#!/usr/bin/env bash
# The wheels the GPU machine lacks (it has torch, transformers, accelerate, safetensors, tokenizers, rich, and no
# network), downloaded here into .gpu-wheels/ (git-ignored, about 45 MB) so they travel with a device command:
#   scripts/gpu_wheels.sh && <device run, carry .gpu-wheels> scripts/gpu_check.sh --wheels .gpu-wheels --out $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=${1:-.gpu-wheels}
PYVER=${GPU_PYTHON:-3.12}  # the GPU machine's Python
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 --platform any -d "$DEST" \
    "bitsandbytes==0.50.2" gguf prompt_toolkit wcwidth platformdirs pytest pluggy iniconfig
ls -la "$DEST"
du -sh "$DEST"
