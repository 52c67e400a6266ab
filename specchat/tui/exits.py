"""SIGTERM and SIGHUP (the terminal closed) leave the chat the way Ctrl-D does.

The handler raises `Terminated`, a SystemExit, so no `except Exception` swallows it: every
`finally` on the way out runs (the terminal's echo and raw mode are restored, half-written temp
files are removed) and `cli.main` turns it into a quiet exit with status 128 + the signal number.
Input history needs nothing more: prompt_toolkit appends each line to the file as it is entered.

A signal can land while the main thread runs a `__del__` or a weakref callback (prompt_toolkit's
redraws make garbage), where Python reports the exception as "Exception ignored in" and goes on: the
chat would stay, with a traceback on the screen. While the handlers are in, such a swallowed
Terminated is sent again a moment later, so the handler raises it once more in the code then running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

LEAVING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(SystemExit):
    """The process was asked to leave by a signal. A SystemExit, because asyncio re-raises only
    SystemExit and KeyboardInterrupt from its callbacks: a signal landing while prompt_toolkit's event
    loop runs one would otherwise be caught there and shown as "Press ENTER to continue..."."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextmanager
def leave_on_signals(signals=LEAVING_SIGNALS) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise Terminated in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_terminated) for signum in signals}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _send_swallowed_signals_again(previous_hook)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _send_swallowed_signals_again(previous_hook):
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, Terminated):  # sent from a thread: here it would land in the hook
            threading.Timer(0.01, os.kill, (os.getpid(), unraisable.exc_value.signum)).start()
        else:
            previous_hook(unraisable)

    return hook


def silence_lost_terminal(stream_fds=(1, 2)) -> None:
    """After SIGHUP the terminal is gone: point stdout/stderr at /dev/null so the last flush at exit
    does not fail with EIO and print an 'Exception ignored' report nobody can read."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in stream_fds:
        try:
            os.dup2(devnull, fd)
        except OSError:
            continue
    os.close(devnull)
