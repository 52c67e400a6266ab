"""docs/numbers.md names every figure a reply reports, one row per `--json` key: the table and the code's
ReplyStats.to_dict() must name the same figures, and each row must say where it shows and what it means."""

from __future__ import annotations

import re
from pathlib import Path

from specchat.speculative.metrics import ReplyStats

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "numbers.md"
ROW = re.compile(r"^\| `(?P<key>\w+)` \| (?P<shows>[^|]+) \| (?P<meaning>[^|]+) \|$")


def glossary_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            assert match["key"] not in rows, f"{match['key']} twice"
            rows[match["key"]] = (match["shows"].strip(), match["meaning"].strip())
    return rows


def test_the_glossary_names_exactly_the_figures_the_code_reports():
    rows = glossary_rows()
    assert list(rows) == list(ReplyStats().to_dict())  # the same names, in the same order
    assert all(shows and len(meaning) > 10 for shows, meaning in rows.values())


def test_the_two_acceptance_figures_are_told_apart():
    text = GLOSSARY.read_text(encoding="utf-8")
    assert "**acceptance** (`acceptance_rate`) = accepted ÷ drafted" in text
    assert "**α per draft** (`alpha_per_draft`) = accepted ÷ (accepted + rejections)" in text
    stats = ReplyStats(drafted=10, accepted=6, rejections=3)
    assert stats.acceptance_rate == 0.6 and stats.alpha_per_draft == 6 / 9
