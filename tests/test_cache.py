"""One builder per cache artefact: the second process (here: thread) waits, saying so, then finds it built."""
from __future__ import annotations

import threading

from specchat.cache import building


def test_a_second_builder_waits_for_the_first_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    target, order, holding, release = tmp_path / "converted" / "model", [], threading.Event(), threading.Event()
    said = []

    def first():
        with building(target, "the model"):
            holding.set()
            release.wait(10)
            order.append("first done")

    def second():
        with building(target, "the model", lambda message, fraction: said.append(message)):
            order.append("second in")
    one = threading.Thread(target=first)
    one.start()
    assert holding.wait(10)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.3)
    assert two.is_alive() and order == []  # blocked while the first builds
    release.set()
    one.join(), two.join(10)
    assert order == ["first done", "second in"]
    assert said == ["another specchat is building the model; waiting for it to finish"]
    assert not list(target.parent.glob("*lock*"))  # lock files live in the cache's locks/ folder


def test_a_builder_alone_takes_the_lock_without_a_word(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    said = []
    with building(tmp_path / "gguf" / "x.gguf", "x", lambda message, fraction: said.append(message)):
        pass
    assert said == [] and (tmp_path / "cache" / "locks" / "gguf-x.gguf.lock").exists()
