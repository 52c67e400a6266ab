"""The documentation stays true: every relative link in the README and the docs resolves, every slash
command is in docs/commands.md, every config key is in docs/config.md, and the README fits a screenful per
topic (≤ 300 lines)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specchat.settings import all_keys
from specchat.tui.commands import build_registry

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MODEL_SECTIONS = ("target", "drafter")


def documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "tests" / "README.md"]
    found += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "bench" / "results").glob("*/README.md"))
    return found


def relative_links(document: Path) -> list[str]:
    targets = [m.group(1) for m in LINK.finditer(document.read_text())]
    return [t for t in targets if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    assert document.is_file(), f"{document.relative_to(ROOT)} is missing"
    broken = [t for t in relative_links(document) if not (document.parent / t.split("#")[0]).exists()]
    assert not broken, f"{document.relative_to(ROOT)} links to missing files: {broken}"


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](here.md) [web](https://example.com) [anchor](#top) [gone](docs/gone.md#x)")
    assert relative_links(page) == ["here.md", "docs/gone.md#x"]


def test_the_readme_is_one_screenful_per_topic():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines"


def test_every_command_is_documented():
    text = (ROOT / "docs" / "commands.md").read_text()
    names = [name for command in build_registry().commands for name in (command.name, *command.aliases)]
    missing = [name for name in names if f"/{name}" not in text]
    assert not missing, f"docs/commands.md does not document {missing}"


def key_is_documented(key: str, text: str) -> bool:
    section, name = key.split(".", 1)
    spelled = [f"`{key}`", f"{key}`"]
    if section in MODEL_SECTIONS:
        spelled.append(f"`*.{name}`")
    return any(spelling in text for spelling in spelled)


def test_every_config_key_is_documented():
    text = (ROOT / "docs" / "config.md").read_text()
    missing = [key for key in all_keys() if not key_is_documented(key, text)]
    assert not missing, f"docs/config.md does not document {missing}"


def test_the_key_check_knows_an_undocumented_key():
    assert key_is_documented("target.dtype", "| `*.dtype` | auto |")
    assert not key_is_documented("sampling.top_k", "| `sampling.top_p` | 1 |")


# ----- names in the code's comments, and the changelog's versions --------------------------------------------
NAMED_FILE = re.compile(r"(?<![\w.])((?:(?:specchat|tests|docs|scripts|bench)/)?(?:[\w-]+/)*[\w-]+\.(?:py|md))\b")
NOT_IN_TREE = (
    "llama.cpp",
    "gpu_bench.md",
    "convert_hf_to_gguf.py",
)  # a project; a GPU bench report; llama.cpp's converter
PLACEHOLDER = re.compile(r"^(?:[A-Z]+/)|^[A-Z]+\.")  # DIR/report.md, PATH.md: a name the user gives


def tree_files() -> set[str]:
    skip = {".venv", ".git", "__pycache__"}
    return {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)}


def missing_names(text: str, files: set[str]) -> list[str]:
    """The .py and .md names in `text` that no file of the tree ends with."""
    names = [
        m.group(1)
        for m in NAMED_FILE.finditer(text)
        if m.group(1) not in NOT_IN_TREE and not PLACEHOLDER.match(m.group(1))
    ]
    return [name for name in names if not any(f == name or f.endswith("/" + name) for f in files)]


def test_every_file_a_comment_names_exists():
    files = tree_files()
    stale = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "specchat").rglob("*.py"))
        for name in missing_names(path.read_text(), files)
    ]
    assert not stale, f"comments name files that do not exist: {stale}"


def test_the_name_check_sees_a_gone_file():
    files = {"specchat/session/compare.py", "docs/gpu.md"}
    text = "# see specchat/compare.py and compare.py, docs/gpu.md, session/compare.py, llama.cpp, PATH.md, gone.md"
    assert missing_names(text, files) == ["specchat/compare.py", "gone.md"]


def test_the_newest_changelog_section_is_the_package_version():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    sections = re.findall(r"^## (\d+)\.(\d+)\.(\d+) \((\d{4}-\d\d-\d\d)\)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert sections, "CHANGELOG.md's sections are not '## X.Y.Z (YYYY-MM-DD): ...'"
    assert ".".join(sections[0][:3]) == version
    versions = [tuple(map(int, s[:3])) for s in sections]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
