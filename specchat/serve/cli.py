"""`specchat serve [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--queue N] [--max-tokens N] [--allow-host NAME]
[--cors ORIGIN] [--config FILE] [--target SOURCE] [--drafter SOURCE] [section.key=value ...]`: load the pair once, as
the chat does, then answer OpenAI-style requests until Ctrl-C or SIGTERM, which end the running reply after its step
in flight (its finish reason and [DONE] sent) and exit. Every error a user can cause before it listens ends in one
line and a non-zero status.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import NoReturn, TextIO

from specchat.config import ConfigError
from specchat.errors import ModelLoadError
from specchat.launch import make_console, prepare, read_pair_config
from specchat.options import UsageError
from specchat.safe_text import visible
from specchat.serve.access_log import to_stderr
from specchat.serve.app import MAX_BODY, Settings, build_app
from specchat.serve.arguments import API_KEY_VARIABLE, build_parser
from specchat.serve.guard import Guard
from specchat.serve.service import Service
from specchat.settings import set_from_text


def check(args) -> None:
    """The options, and that the address can be listened on, before the models load."""
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be from 1 to 65535, got {args.port}")
    if args.queue < 1:
        raise UsageError(f"--queue must be at least 1, got {args.queue}")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    try:
        socket.create_server((args.host, args.port)).close()
    except OSError as err:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None


def serve(args, load: Callable, stderr: TextIO, run: Callable | None = None) -> int:
    check(args)
    cfg = set_from_text(read_pair_config(args), "speculation.compare", "off")
    status = make_console(False, stderr)
    pair, session, _ = prepare(cfg, load, None, status)
    service = Service(
        session.engine,
        session.tokenizer,
        cfg.ui.system_prompt,
        session.context_limit,
        session.stop_strings,
        args.queue,
        args.max_tokens,
    )
    name = pair.target_facts.name
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE, "")
    guard = Guard.of(args.host, args.allow_host, args.cors)
    app = build_app(service, Settings(name, cfg, api_key, MAX_BODY, guard, to_stderr))
    stderr.write(
        f"specchat serve: {visible(name)} on http://{args.host}:{args.port}/v1"
        f"{' (API key required)' if api_key else ''}; Ctrl-C stops\n"
    )
    stderr.flush()
    if run is not None:
        run(app, args.host, args.port)
        return 0
    run_until_signalled(app, args.host, args.port)
    leave_now()  # the replies are done and nothing is left to write: skip tearing down gigabytes of weights


def leave_now() -> NoReturn:
    """Exit 0 at once, its output flushed: an interpreter's teardown of a loaded pair takes seconds (3 s for the
    bundled pair) and does nothing a stopped server needs."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def run_until_signalled(app, host: str, port: int) -> None:
    """uvicorn until SIGINT or SIGTERM: the running replies end after their step in flight, each with its finish
    reason and [DONE], the server closes, and the reply threads are waited for (a process that exits while one is
    inside torch aborts). Being stopped is how a server ends: no signal is raised again after it (status 0); a
    second Ctrl-C forces the close."""
    import contextlib
    import signal

    import uvicorn

    service = app.state.service

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            service.stop_all()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            handled = (signal.SIGINT, signal.SIGTERM)
            before = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_S)
    try:
        Server(config).run()
    finally:
        service.stop_all()
        service.wait_idle(SHUTDOWN_S)


SHUTDOWN_S = 2  # what a stopping server waits for its replies' last steps


def main(argv: list[str] | None = None, load: Callable | None = None, stderr: TextIO | None = None) -> int:
    """`specchat serve ...`; returns the exit status."""
    stderr = stderr or sys.stderr
    if load is None:
        from specchat.loading.models import load_pair

        load = load_pair
    try:
        args = build_parser().parse_args(sys.argv[2:] if argv is None else argv)
        return serve(args, load, stderr)
    except (UsageError, ConfigError, ModelLoadError) as err:
        stderr.write(f"specchat serve: error: {visible(str(err))}\n")
        return 2 if isinstance(err, (UsageError, ConfigError)) else 1
    except KeyboardInterrupt:
        return 130
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
