"""The programs shorten OpenMP's spin before torch loads it; importing specchat as a library changes nothing;
a user's own choice is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

from specchat.threads import SPIN_COUNT, set_wait_policy


def seen_by_a_fresh_process(code: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_importing_specchat_changes_no_environment_and_loads_no_torch():
    code = "import specchat, os, sys; print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT', '-'))"
    assert seen_by_a_fresh_process(code) == "False -"
    code = "import specchat, os; specchat.stream; print(os.environ.get('GOMP_SPINCOUNT', '-'))"
    assert seen_by_a_fresh_process(code) == "-"  # using the API loads torch, and still sets nothing


def test_the_programs_set_the_spin_count_before_torch_loads():
    code = (
        "import os, sys, specchat.entry as e\n"
        "sys.argv = ['specchat', '--help']\n"
        "try:\n    e.main()\nexcept SystemExit:\n    pass\n"
        "print(os.environ.get('GOMP_SPINCOUNT', '-'))"
    )
    assert seen_by_a_fresh_process(code).splitlines()[-1] == SPIN_COUNT
    code = "import os, sys, specchat.bench; print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT', '-'))"
    assert seen_by_a_fresh_process(code) == f"False {SPIN_COUNT}"


def test_a_users_own_wait_policy_is_kept():
    environ = {}
    set_wait_policy(environ)
    assert environ == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "500"}):
        environ = dict(chosen)
        set_wait_policy(environ)
        assert environ == chosen
