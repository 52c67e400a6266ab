"""ninja on a leash: run as the `ninja` torch's extension builder calls while specchat compiles its kernel, it asks
the OS to send ninja SIGTERM when the process that started it dies (prctl PR_SET_PDEATHSIG, kept across exec), then
becomes the real ninja. So a start killed mid-build (SIGKILL, the OOM killer) takes its compilers with it: ninja,
on SIGTERM, stops the compile jobs it runs (each in a process group of its own) and exits, where they ran on for
tens of seconds before. Standard library only: it runs before anything else is imported.

    python ninja_leash.py PARENT_PID REAL_NINJA [ninja's arguments...]
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def leash() -> None:
    """SIGTERM to this process (and, after exec, to ninja) when its parent dies; nothing where prctl is not had."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the build runs as before
        pass


def main(argv: list[str]) -> int:
    parent, real, arguments = int(argv[0]), argv[1], argv[2:]
    leash()
    if os.getppid() != parent:  # the starter died before the leash was on: nothing to build for
        return 1
    os.execv(real, [real, *arguments])
    return 1  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
