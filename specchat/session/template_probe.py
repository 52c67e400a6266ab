"""A model's chat template is its file's text, run in Jinja's sandbox: the sandbox stops escapes, not a template
that loops for ever or grows a string without end. Before the first turn (the chat's warm-up, the server's start)
the template renders a short probe chat in a child process, with a wall-clock limit and a memory limit, so such a
template is one line at start instead of a hung chat or a machine out of memory. Where a process cannot fork (not
POSIX) the probe is skipped; a template's ordinary errors stay render_prompt's, one line each."""

from __future__ import annotations

import os
import signal
import time

from specchat.session.chat import TemplateFailure

PROBE_SECONDS = 10.0  # a real template renders a short chat in milliseconds
PROBE_BYTES = 1 << 30  # the memory the probe may take beyond what the process has mapped already
PROBE_CHARS = 4 << 20  # the longest text a short chat may render to
TOO_LONG, OUT_OF_MEMORY = 3, 4  # the child's exit codes
PROBE_CHAT = [
    {"role": "user", "content": "Hello."},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "Say goodbye."},
]


def probe_template(tokenizer, system_prompt: str) -> None:
    """Render PROBE_CHAT (after the system prompt) in a forked child: TemplateFailure (one line) when it takes more
    than PROBE_SECONDS, more than PROBE_BYTES of new memory, or renders more than PROBE_CHARS."""
    if not hasattr(os, "fork"):
        return
    conversation = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + PROBE_CHAT
    pid = os.fork()
    if pid == 0:  # the child: render, and say how it went in its exit code only
        os._exit(_render_bounded(tokenizer, conversation))
    status = _wait(pid, PROBE_SECONDS)
    if status is None:
        raise TemplateFailure(f"the model's chat template did not finish a three-message chat in {PROBE_SECONDS:g} s")
    if os.WIFSIGNALED(status):
        raise TemplateFailure(f"the model's chat template was killed by signal {os.WTERMSIG(status)} on a short chat")
    code = os.WEXITSTATUS(status)
    if code == TOO_LONG:
        raise TemplateFailure(f"the model's chat template wrote more than {PROBE_CHARS:,} characters for a short chat")
    if code == OUT_OF_MEMORY:
        raise TemplateFailure(f"the model's chat template took more than {PROBE_BYTES >> 20:,} MiB for a short chat")


def _render_bounded(tokenizer, conversation: list[dict[str, str]]) -> int:
    """In the child: the exit code. A template's own error is 0 here: render_prompt says it in the parent."""
    try:
        _limit_memory()
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return TOO_LONG if len(text) > PROBE_CHARS else 0
    except MemoryError:
        return OUT_OF_MEMORY
    except BaseException:
        return 0


def _limit_memory() -> None:
    """Cap the child's address space at what it has mapped now plus PROBE_BYTES (Linux; elsewhere, or where the
    hard limit is lower, the time limit alone holds)."""
    import resource

    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + PROBE_BYTES, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (OSError, ValueError):
        return


def _wait(pid: int, seconds: float) -> int | None:
    """The child's wait status, or None after killing it at `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)
