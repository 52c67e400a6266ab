"""early_pages.py: a start remembers the sizes of the tile regions it took; the next start of the same command line
faults regions of those sizes in on a thread from its first line, and a placement of exactly that size takes one."""

from __future__ import annotations

import json
import mmap
import threading

import pytest

from specchat import early_pages
from specchat.early_pages import HUGE_PAGE, EarlyRegions, read_hints

offered = pytest.mark.skipif(
    not early_pages.huge_pages_offered(), reason="this system offers no transparent huge pages"
)
MB = 1 << 20


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    monkeypatch.setattr(early_pages, "_START", None)
    return tmp_path


def test_a_start_remembers_the_sizes_it_took_for_its_command_line(tmp_path):
    hints = tmp_path / "regions.json"
    hints.write_text(json.dumps({"other": [5 * MB]}))
    start = EarlyRegions(hints, "this")
    assert start.take(3 * MB) is None and start.take(7 * MB) is None  # nothing faulted in ahead
    start.finish()
    assert read_hints(hints) == {"other": [5 * MB], "this": [3 * MB, 7 * MB]}
    assert list(read_hints(hints)) == ["other", "this"]  # the latest last: the first forgotten past KEPT


def test_only_the_latest_command_lines_are_kept(tmp_path):
    hints = tmp_path / "regions.json"
    for n in range(early_pages.KEPT + 3):
        start = EarlyRegions(hints, f"line {n}")
        start.take(MB)
        start.finish()
    assert list(read_hints(hints)) == [f"line {n}" for n in range(3, early_pages.KEPT + 3)]


@offered
def test_the_regions_remembered_are_faulted_in_and_taken_once_each_of_their_own_size(tmp_path):
    start = EarlyRegions(tmp_path / "regions.json", "this")
    start.start([3 * MB, 5 * MB])
    start.wait()
    assert start.held() == 8 * MB  # the alignment pages aside
    region = start.take(3 * MB)
    assert isinstance(region, mmap.mmap) and len(region) == 3 * MB + HUGE_PAGE
    assert region[: 3 * MB + HUGE_PAGE] == bytes(3 * MB + HUGE_PAGE)  # zeros, every page there
    assert start.take(3 * MB) is None and start.take(4 * MB) is None  # once; and no other size is given one
    assert start.held() == 5 * MB
    untaken = list(start.ready)
    start.finish()
    assert start.held() == 0 and all(kept.closed for kept in untaken)  # unmapped once the models are loaded
    assert read_hints(tmp_path / "regions.json") == {"this": [3 * MB, 3 * MB, 4 * MB]}
    region.close()


@offered
def test_only_the_pages_already_faulted_in_count_as_held(tmp_path, monkeypatch):
    """The pages of a region still to fault are in the system's available memory: the memory check must not count
    them again as held."""
    gate, reached = threading.Event(), threading.Event()
    real = early_pages.fault_in

    def slow(region, done):
        if len(region) == 5 * MB + HUGE_PAGE:  # the second region: 1 MB resident, then it waits
            done(MB)
            reached.set()
            gate.wait()
        real(region, done)

    monkeypatch.setattr(early_pages, "fault_in", slow)
    start = EarlyRegions(tmp_path / "regions.json", "this")
    start.start([3 * MB, 5 * MB])
    assert reached.wait(10)
    assert start.held() == 3 * MB + MB
    gate.set()
    start.wait()
    assert start.held() == 8 * MB  # the second region's first MB not counted twice
    start.finish()


def test_a_region_is_faulted_in_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(early_pages, "CHUNK", 3 * 4096)
    region = mmap.mmap(-1, 8 * 4096)
    region.write(b"x" * len(region))
    told = []
    early_pages.fault_in(region, told.append)
    assert told == [3 * 4096, 3 * 4096, 2 * 4096] and region[:] == bytes(len(region))
    region.close()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        json.dumps({"this": "3145728"}),
        json.dumps({"this": [-1]}),
        json.dumps({"this": [True]}),
        json.dumps({"this": [1.5]}),
        json.dumps({"this": [MB] * (early_pages.MOST_REGIONS + 1)}),
    ],
)
def test_a_damaged_hints_file_faults_nothing_in(cache, text):
    (cache / early_pages.HINTS).write_text(text)
    early_pages.start(["--max", "1"], cwd="/here")
    assert early_pages.held_bytes() == 0 and early_pages.take(MB) is None
    early_pages.finish()
    key = early_pages.command_key(["--max", "1"], "/here")
    assert read_hints(cache / early_pages.HINTS)[key] == [MB]  # written again, whole


@offered
def test_a_start_faults_in_what_the_same_command_line_took_and_no_more_than_fits(cache, monkeypatch):
    early_pages.start(["a"], cwd="/here")
    assert early_pages.held_bytes() == 0 and early_pages.take(3 * MB) is None
    early_pages.finish()
    early_pages.start(["b"], cwd="/here")  # another command line: nothing remembered
    assert early_pages.held_bytes() == 0
    early_pages.finish()
    with monkeypatch.context() as patched:
        patched.setattr(early_pages, "available_memory", lambda: 5 * MB)  # 3 MB is more than half of it
        early_pages.start(["a"], cwd="/here")
        assert early_pages.held_bytes() == 0
        early_pages.finish()
    early_pages.start(["a"], cwd="/here")
    early_pages._START.wait()
    assert early_pages.held_bytes() == 3 * MB
    region = early_pages.take(3 * MB)
    assert region is not None and len(region) == 3 * MB + HUGE_PAGE
    early_pages.finish()
    assert early_pages.held_bytes() == 0 and early_pages.take(3 * MB) is None  # finished: nothing more is faulted in


def test_without_a_start_nothing_is_held_taken_or_remembered(cache):
    assert early_pages.held_bytes() == 0 and early_pages.take(MB) is None
    early_pages.finish()
    assert not (cache / early_pages.HINTS).exists()


def test_a_cache_that_cannot_be_written_only_loses_the_hint(tmp_path):
    hints = tmp_path / "gone" / "regions.json"  # its folder is not there: the write fails
    start = EarlyRegions(hints, "this")
    start.take(MB)
    start.finish()  # no error: the next start faults its pages in the ordinary way
    assert read_hints(hints) == {} and list(tmp_path.iterdir()) == []
    assert not early_pages.write_hints(hints, {"this": [MB]})
    assert early_pages.write_hints(tmp_path / "regions.json", {"this": [MB]})
    assert read_hints(tmp_path / "regions.json") == {"this": [MB]}
