"""specchat shortens OpenMP's spin before torch loads it, and leaves a user's own choice alone."""

from __future__ import annotations

import os
import subprocess
import sys

from specchat.threads import SPIN_COUNT, set_wait_policy


def spin_count_seen_by_a_fresh_process() -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = "import specchat, os, sys; assert 'torch' in sys.modules; print(os.environ.get('GOMP_SPINCOUNT', '-'))"
    return subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_importing_specchat_sets_the_spin_count_before_torch_loads():
    assert spin_count_seen_by_a_fresh_process() == SPIN_COUNT
    # torch is imported by specchat's own import, after the policy is set
    source = open(os.path.join(os.path.dirname(__file__), "..", "specchat", "__init__.py")).read()
    assert source.index("set_wait_policy()") < source.index("from specchat.api")


def test_a_users_own_wait_policy_is_kept():
    environ = {}
    set_wait_policy(environ)
    assert environ == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "500"}):
        environ = dict(chosen)
        set_wait_policy(environ)
        assert environ == chosen
