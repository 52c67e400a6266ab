"""The probe list (tests/probes.py) stays true: every file it names exists, and every class finds tests by its
words, so `pytest -m probe` never silently runs fewer probes than it says."""

from __future__ import annotations

import re
from pathlib import Path

from probes import PROBES, is_probe

ROOT = Path(__file__).resolve().parents[1]


def test_every_probe_class_finds_tests_in_files_that_exist():
    for kind, files in PROBES.items():
        found = 0
        for file, words in files.items():
            path = ROOT / file
            assert path.is_file(), f"{kind}: {file} is gone"
            names = re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
            matched = [name for name in names if is_probe(f"{file}::{name}")]
            assert matched, f"{kind}: no test of {file} holds {words}"
            found += len(matched)
        assert found, kind


def test_a_test_outside_the_list_is_no_probe():
    assert not is_probe("tests/tui/test_cli.py::test_the_banner_names_the_models")
    assert is_probe("tests/tui/test_cli.py::test_a_template_that_loops_or_grows_ends_the_start_in_one_line[loop]")
