"""`make lint`'s dead-code check (scripts/dead_code.py) finds a function nothing calls, and only in specchat/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dead_code_module():
    spec = importlib.util.spec_from_file_location("dead_code", ROOT / "scripts" / "dead_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_function_nothing_calls_is_named_and_one_a_test_calls_is_not(tmp_path):
    (tmp_path / "specchat").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "specchat" / "parts.py").write_text(
        "def used_by_a_test():\n    return 1\n\n\ndef forgotten():\n    return 2\n"
    )
    (tmp_path / "tests" / "test_parts.py").write_text(
        "from specchat.parts import used_by_a_test\n\n\ndef test_it():\n    assert used_by_a_test() == 1\n\n\n"
        "def never_called_helper():\n    return 3\n"
    )
    reports = dead_code_module().unused(tmp_path)
    assert len(reports) == 1 and "forgotten" in reports[0] and "parts.py" in reports[0]


def test_the_package_has_no_dead_code():
    assert dead_code_module().unused() == []
