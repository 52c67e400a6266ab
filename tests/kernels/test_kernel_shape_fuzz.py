"""1,000 bad shapes, strides, dtypes, devices and layer lists (tests/kernels/shape_fuzz.py) driven into every
entry point of the compiled kernel module, on every code path this CPU has: each raises ValueError or
RuntimeError with a message, none returns, none crashes. The cases run in a process of their own, so a crash
(a write past an array, a read of a null pointer, a division by zero) fails this test instead of ending the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).with_name("shape_fuzz.py")
CASES = 1000


def test_a_thousand_bad_shapes_each_raise_and_none_crashes(kernel):
    root = FUZZ.parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, str(FUZZ), "--cases", str(CASES), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env=env,
    )
    last_case = (done.stderr.strip().splitlines() or ["(none)"])[-1]
    assert done.returncode == 0, f"the fuzz ended with {done.returncode} during {last_case}\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failures"] == [], f"{len(report['failures'])} cases did not raise:\n" + "\n".join(
        report["failures"][:40]
    )
    assert report["cases"] == report["raised"] == CASES
    assert set(report["paths"]) == set(kernel.kernel_paths())
