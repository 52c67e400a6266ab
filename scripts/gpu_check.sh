#!/usr/bin/env bash
# The GPU check, end to end, from a fresh machine with a CUDA GPU and no network (docs/gpu.md):
#   scripts/gpu_check.sh --out DIR [--quick] [--wheels DIR] [--configs]
#     --out DIR     where the report goes: report.md (the summary and tables), environment.txt, gpu_tests.xml,
#                   gpu_bench.json / gpu_bench.md, chat_oneshot.json, chat_pipe.txt, and the whole log (gpu_check.log)
#     --quick       a first contact in under 5 minutes: the gpu tests, the bench at the bundled target's shape in
#                   bf16 (small and self pairs), the chat on it; without it, the bench's full matrix
#                   (1.5B and 7B shapes × bf16, nf4, 8-bit, float32 × small, nf4-self, self drafters)
#     --wheels DIR  install the wheels there first, offline (scripts/gpu_wheels.sh downloads them elsewhere)
#     --configs     also each shipped config's load and first reply (downloads weights: needs the hub)
# It exits non-zero when a gpu test, a bench row or a chat run failed.
# A dry run of the same steps on a CPU (the tests skip, the bench at the tiny shape):
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_SHAPE=tiny GPU_CHECK_BENCH="--variants float32" scripts/gpu_check.sh --quick --out /tmp/g
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=gpu-check QUICK="" WHEELS="" CONFIGS=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --quick) QUICK=--quick; shift ;;
        --configs) CONFIGS=1; shift ;;
        *) echo "gpu_check.sh: unknown argument '$1' (see the header of $0)"; exit 2 ;;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/gpu_check.log") 2>&1
PY=${PY:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # specchat from this tree, no install step
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
start=$(date +%s)
failed=0

if [[ -n "$WHEELS" ]]; then
    echo "== installing the carried wheels ($WHEELS)"
    "$PY" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl || failed=1
fi

echo "== environment"
{
    nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv 2>/dev/null \
        || echo "nvidia-smi: not found"
    "$PY" scripts/gpu_environment.py
} | tee "$OUT/environment.txt"

echo "== gpu tests"
"$PY" -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml"
tests_status=$?
[[ $tests_status -eq 0 ]] || failed=1

DEVICE=${GPU_CHECK_DEVICE:-cuda}
SHAPE=${GPU_CHECK_SHAPE:-1.5b}  # the chat's pair: this shape's target and its small drafter, as the bench built them
MODELS=${GPU_WORK:-/tmp/specchat-gpu-models}
SHAPES=$( [[ -n "$QUICK" ]] && echo "--shapes $SHAPE" )
echo "== gpu bench"
# shellcheck disable=SC2086  # the flags are words
"$PY" -m specchat.bench.gpu --out "$OUT" --work "$MODELS" --device "$DEVICE" $QUICK $SHAPES ${GPU_CHECK_BENCH:-} \
    || failed=1

echo "== the chat on $DEVICE: one-shot and a REPL through a pipe"
DRAFTER=$("$PY" -c "from specchat.bench.gpu import SMALL_DRAFTER; print(SMALL_DRAFTER['$SHAPE'])")
DTYPE=$( [[ "$DEVICE" == cpu ]] && echo float32 || echo bfloat16 )
PAIR=(target.source="$MODELS/qwen2-$SHAPE-seed0" drafter.source="$MODELS/qwen2-$DRAFTER-seed1"
      target.device="$DEVICE" drafter.device="$DEVICE" target.dtype=$DTYPE drafter.dtype=$DTYPE
      sampling.max_new_tokens=32)
"$PY" infer.py --prompt "w1 w2 w3 w4" --json "${PAIR[@]}" > "$OUT/chat_oneshot.json" || failed=1
printf 'w5 w6 w7\n/gamma 6\nw8 w9\n/stats\n/quit\n' | "$PY" infer.py --no-color "${PAIR[@]}" > "$OUT/chat_pipe.txt" 2>&1 \
    || failed=1
tail -n 5 "$OUT/chat_pipe.txt"

if [[ -n "$CONFIGS" ]]; then
    echo "== shipped configs: load and first reply (needs the hub)"
    for config in specchat/configs/*.toml; do
        echo "-- $config"
        HF_HUB_OFFLINE=0 "$PY" infer.py --config "$config" --prompt "Write a Python function that reverses a list." \
            --json sampling.max_new_tokens=64 || echo "   ($config did not run: see above)"
    done
fi

"$PY" scripts/gpu_report.py "$OUT" "$tests_status" "$(( $(date +%s) - start ))" > "$OUT/report.md"
cat "$OUT/report.md"
exit $failed
