#!/usr/bin/env bash
# The compiled kernel module under AddressSanitizer (issue 48): the 1,000-case shape fuzz and the kernel tests
# (every code path this CPU has, the layer loop, sampling) against a build with -fsanitize=address.
#
# How: every Python process of the run (pytest, and the fuzz's own process) loads a sitecustomize.py from a
# scratch folder that adds "-fsanitize=address -fno-omit-frame-pointer -g" to specchat.kernels.build's flags, so
# the module builds through its ordinary path (same sources, same torch loader) into a cache of its own
# ($ASAN_DIR/cache; the flags are part of the build folder's name anyway). libasan is preloaded into Python
# (the interpreter itself is not instrumented; the module's heap and stack accesses are, and torch's tensors
# come from malloc, so a read or write past one is a report), with libstdc++ after it: Python does not link
# libstdc++, and without it loaded first ASan cannot find the real __cxa_throw, so the first TORCH_CHECK that
# throws aborts ("CHECK failed: real___cxa_throw != 0"). Leak checks are off: Python keeps its objects to the
# end on purpose. Any report ends the process (abort_on_error) and is written to $ASAN_DIR/reports/asan.*
# (pytest captures stderr); the run fails when one is there.
#
#   scripts/asan_kernels.sh              # fuzz + tests/kernels + the kernel's tests in quant/, speculative/, runtime/
#   scripts/asan_kernels.sh -k fuzz      # extra arguments go to pytest
# The first run compiles the instrumented module: about 15 minutes on 2 busy cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
ASAN_DIR=${ASAN_DIR:-/tmp/specchat-asan}
LIBASAN=$("${CXX:-c++}" -print-file-name=libasan.so)
LIBSTDCXX=$("${CXX:-c++}" -print-file-name=libstdc++.so)
[ -f "$LIBASAN" ] || { echo "asan_kernels: ${CXX:-c++} has no libasan.so ($LIBASAN)" >&2; exit 2; }

rm -rf "$ASAN_DIR/reports"
mkdir -p "$ASAN_DIR/site" "$ASAN_DIR/cache" "$ASAN_DIR/reports"
cat > "$ASAN_DIR/site/sitecustomize.py" <<'PY'
"""scripts/asan_kernels.sh: the kernel module of this process is built with AddressSanitizer."""
import specchat.kernels.build as _build

_plain_flags = _build.kernel_flags
_build.kernel_flags = lambda *paths: [*_plain_flags(*paths), "-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
PY

export SPECCHAT_CACHE="$ASAN_DIR/cache"
export PYTHONPATH="$ASAN_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:symbolize=1:log_path=$ASAN_DIR/reports/asan"
export LD_PRELOAD="$LIBASAN:$LIBSTDCXX${LD_PRELOAD:+:$LD_PRELOAD}"

echo "asan_kernels: libasan $LIBASAN, cache $SPECCHAT_CACHE" >&2
"$PYTHON" - <<'PY'
import subprocess

import specchat.kernels.build as build

module = build.q4_kernel()
symbols = subprocess.run(["nm", "-D", module.__file__], capture_output=True, text=True).stdout
assert "__asan_report" in symbols, f"{module.__file__} is not instrumented"
print("asan_kernels: flags", " ".join(build.kernel_flags()))
print("asan_kernels: instrumented module", module.__file__)
PY
status=0
"$PYTHON" -m pytest -q -p no:cacheprovider -p no:xdist -m "not slow" \
  tests/kernels tests/quant/test_w4a8.py tests/speculative/test_sampling.py tests/runtime/test_lean_native.py "$@" || status=$?
if compgen -G "$ASAN_DIR/reports/asan.*" > /dev/null; then
  echo "asan_kernels: AddressSanitizer reports:" >&2
  cat "$ASAN_DIR"/reports/asan.* >&2
  exit 1
fi
echo "asan_kernels: no AddressSanitizer report (pytest exit $status)" >&2
exit "$status"
