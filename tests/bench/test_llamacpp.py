"""llama.cpp as a bench peer: when its rows run, what they are compared with, and the greedy drafter
that feeds llama-cpp-python's draft hook (tested on a fake context: llama-cpp-python is not a test
dependency)."""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace

import numpy as np

from specchat.bench import llamacpp
from specchat.bench.methods import default_methods
from specchat.config import SamplingConfig
from specchat.settings import load_config


def test_without_llama_cpp_python_the_rows_are_skipped_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    reason = llamacpp.unavailable(load_config(None, []))
    assert reason.startswith("llama.cpp rows skipped") and "[llamacpp]" in reason


def test_a_target_that_is_not_a_gguf_file_has_no_llama_cpp_rows(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", SimpleNamespace())
    (tmp_path / "config.json").write_text("{}")
    cfg = load_config(None, [f"target.source={tmp_path}", "drafter.source="])
    assert "not a GGUF file" in llamacpp.unavailable(cfg)


def test_llama_cpp_rows_are_compared_with_llama_cpp_target_only():
    methods = default_methods(load_config(None, []), llamacpp=True)
    rows = [m for m in methods if m.kind == "llama.cpp"]
    assert [m.name for m in rows] == [
        "llama.cpp target-only",
        "llama.cpp speculative γ4",
        "llama.cpp speculative γ8",
        "llama.cpp n-gram",
    ]
    assert {m.baseline for m in rows} == {"llama.cpp target-only"}
    assert all(m.baseline == "specchat target-only" for m in methods if m.kind != "llama.cpp" and not m.target)


def test_llama_cpp_samples_with_specchats_settings_and_nothing_else():
    greedy = llamacpp._options(SamplingConfig(temperature=0.0))
    assert greedy["temp"] == 0.0 and greedy["min_p"] == 0.0 and greedy["repeat_penalty"] == 1.0
    sampled = llamacpp._options(SamplingConfig(temperature=0.7, top_p=0.9, top_k=5))
    assert (sampled["temp"], sampled["top_p"], sampled["top_k"], sampled["min_p"]) == (0.7, 0.9, 5, 0.0)
    shaped = llamacpp._options(SamplingConfig(temperature=0.7, min_p=0.05, repeat_penalty=1.1, presence_penalty=0.5))
    assert (shaped["min_p"], shaped["repeat_penalty"], shaped["presence_penalty"]) == (0.05, 1.1, 0.5)


class FakeLlama:
    """A context whose next-token logits favour (last token + 1) mod 10."""

    def __init__(self):
        self.input_ids = np.zeros(64, dtype=np.intc)
        self.n_tokens = 0
        self.fed: list[list[int]] = []
        self._ctx = SimpleNamespace(kv_cache_seq_rm=lambda seq, start, end: None, get_logits=self._logits)

    def n_vocab(self) -> int:
        return 10

    def eval(self, tokens: list[int]) -> None:
        self.fed.append(list(tokens))
        self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)

    def _logits(self):
        self.logits = np.zeros(10, dtype=np.float32)  # kept alive while the pointer is read
        self.logits[(int(self.input_ids[self.n_tokens - 1]) + 1) % 10] = 1.0
        return self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def test_the_greedy_drafter_drafts_gamma_tokens_and_feeds_only_what_it_has_not_seen():
    fake = FakeLlama()
    drafter = llamacpp.GreedyDrafter(fake)
    drafter.gamma = 3
    assert drafter(np.array([5, 6, 7], dtype=np.intc)).tolist() == [8, 9, 0]
    assert fake.fed == [[5, 6, 7], [8], [9]]  # the last draft is not fed
    fake.fed.clear()
    assert drafter(np.array([5, 6, 7, 8, 4], dtype=np.intc)).tolist() == [5, 6, 7]  # 9 was rejected
    assert fake.fed[0] == [4]  # kept 5 6 7 8, fed the corrected token only


class RecordingLlama:
    """A Llama whose generate() yields a fixed reply and says which instance ran."""

    def __init__(self, name: str, ran: list[str]):
        self.name, self.ran = name, ran

    def reset(self) -> None:
        pass

    def set_seed(self, seed: int) -> None:
        pass

    def generate(self, ids, reset, **options):
        self.ran.append(self.name)
        yield from (1, 2, 3)


def test_each_llama_cpp_row_runs_its_own_llama_and_the_n_gram_row_drafts_without_a_model():
    ran: list[str] = []
    runner = object.__new__(llamacpp.LlamaCppRunner)
    runner.target, runner.ngram, runner.speculative = (RecordingLlama(n, ran) for n in ("target", "ngram", "spec"))
    runner.drafter = SimpleNamespace(gamma=0)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=2)
    for gamma in (None, llamacpp.NGRAM, 8):
        new, seconds = runner.generate([5, 6], sampling, eos_ids={99}, gamma=gamma)
        assert new == (1, 2) and seconds >= 0
    assert ran == ["target", "ngram", "spec"] and runner.drafter.gamma == 8
