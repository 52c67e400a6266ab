"""How the OpenMP threads of torch and of specchat's kernel wait between parallel regions.

GNU OpenMP's threads spin up to 300,000 times before they sleep. When another process keeps one
of a 2-core machine's cores busy, a spinning thread is never woken ahead of it: each of the several
hundred parallel regions of a forward waits a scheduler time slice for it, and the bundled target's
step took 2.8 s instead of 79 ms here. Spinning 10,000 times covers the gaps inside a forward
(the same 79 ms on a quiet machine) and sleeps between them: 0.23–0.26 s with a core busy.

It must be set before torch loads libgomp, so the programs (entry.py: the chat and the server; the bench's
package) set it first thing, unless the user chose a wait policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT) already.
Importing specchat as a library sets nothing: a program that uses the API keeps its own environment.
"""

from __future__ import annotations

import os

SPIN_COUNT = "10000"


def set_wait_policy(environ=os.environ) -> None:
    """GOMP_SPINCOUNT = SPIN_COUNT, unless the user set it or OMP_WAIT_POLICY."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT
