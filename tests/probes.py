"""The probe suite: every test that feeds specchat a bad input or a fault and checks it holds (one line, nothing
lost, no traceback, no hang), by class. conftest.py marks them `probe`, so

    pytest -m probe -q

runs them all and counts them (docs/reliability.md). A class is a whole test file, or the tests of a file whose
names hold one of the words given."""

from __future__ import annotations

PROBES: dict[str, dict[str, tuple[str, ...]]] = {
    "non-finite numbers: weights in every quantization, NaN/inf laws, a NaN drafter": {
        "tests/loading/test_finite_weights.py": (),
        "tests/speculative/test_sampling.py": ("nan", "no_law", "not_a_distribution", "infinite"),
        "tests/guarantees/test_distribution.py": ("nan_drafter",),
        "tests/tui/test_cli.py": ("logits_are_nan",),
        "tests/runtime/test_lean_native.py": ("past_its_range",),
    },
    "crafted GGUF files: headers, sizes, types": {
        "tests/loading/test_gguf_header.py": (),
        "tests/loading/test_gguf_types.py": ("cannot_dequantize", "say_what_they_need"),
    },
    "chat templates that fail, loop or grow": {
        "tests/session/test_chat.py": ("failing_chat_template",),
        "tests/tui/test_cli.py": ("template",),
    },
    "files the chat reads and writes: /load, /save, special files, links, full disks": {
        "tests/tui/test_user_files.py": (),
    },
    "prompts and system prompts past the context": {
        "tests/tui/test_cli.py": ("past_the_context",),
        "tests/session/test_chat.py": ("too_long", "overflow"),
    },
    "text that would drive or spoof the terminal: controls, bidi, invisible characters": {
        "tests/tui/test_terminal_safety.py": (),
    },
    "random and hostile command lines": {
        "tests/tui/test_repl_fuzz.py": (),
    },
    "killed and concurrent starts, damaged caches, a killed kernel build": {
        "tests/guarantees/test_cache_faults.py": (),
        "tests/kernels/test_ninja_leash.py": (),
        "tests/test_cache_folder.py": ("concurrent", "two_starts", "another", "stale", "killed"),
    },
    "bad shapes and values fed to the compiled kernels": {
        "tests/kernels/test_kernel_shape_fuzz.py": (),
    },
}


def is_probe(nodeid: str) -> bool:
    """Whether the test `nodeid` (path::name[params]) is one of the probes."""
    path, _, name = nodeid.partition("::")
    name = name.lower()
    return any(
        path == file and (not words or any(word in name for word in words))
        for files in PROBES.values()
        for file, words in files.items()
    )
