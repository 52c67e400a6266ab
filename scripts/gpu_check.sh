#!/usr/bin/env bash
# One command for a machine with a CUDA GPU: what it has, then specchat's GPU tests (tests/gpu/, marked `gpu`).
#   scripts/gpu_check.sh            environment + the gpu tests (a tiny pair built offline: no download)
#   scripts/gpu_check.sh --configs  also each shipped config's load and first reply (downloads the weights
#                                   from the Hugging Face hub; a config whose weights cannot be had is reported)
#   scripts/gpu_check.sh --bench    also a short benchmark of the bundled pair (python -m specchat.bench --quick)
# Everything goes to the terminal and to gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOG=${LOG:-gpu_check.log}
exec > >(tee "$LOG") 2>&1

echo "== environment"
nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv 2>/dev/null || echo "nvidia-smi: not found"
"$PY" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i}", torch.cuda.get_device_name(i), "capability", torch.cuda.get_device_capability(i))
for name in ("transformers", "accelerate", "bitsandbytes"):
    try:
        print(name, __import__(name).__version__)
    except Exception as err:  # a missing package is part of the report
        print(name, "unavailable:", err)
PY

echo "== gpu tests"
"$PY" -m pytest -m gpu tests/gpu -v -rs
status=$?

if [[ " $* " == *" --configs "* ]]; then
    echo "== shipped configs: load and first reply"
    for config in specchat/configs/*.toml; do
        echo "-- $config"
        "$PY" infer.py --config "$config" --prompt "Write a Python function that reverses a list." --json \
            sampling.max_new_tokens=64 || echo "   ($config did not run: see above)"
    done
fi

if [[ " $* " == *" --bench "* ]]; then
    echo "== bench --quick"
    "$PY" -m specchat.bench --quick
fi

echo "== gpu tests exit status: $status (report: $LOG)"
exit $status
