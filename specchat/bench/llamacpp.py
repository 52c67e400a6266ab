"""llama.cpp as a peer in the benchmark, through llama-cpp-python, on the same GGUF files.

    pip install -e ".[llamacpp]"     # builds llama.cpp from source (about 10 minutes on 2 cores)

Rows: llama.cpp target-only, llama.cpp speculative with the drafter GGUF drafting greedily `gamma`
tokens a step (llama-cpp-python's `draft_model` hook; its own loop verifies the drafts), and llama.cpp
n-gram: the same loop drafting by prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding, up to
NGRAM_TOKENS tokens copied after the context's latest match of its last tokens), no drafter model.
Both use the same prompt ids, token limit, stop ids, sampling settings and thread count as specchat.
Without the extra, or without GGUF sources, the rows are left out with one line saying why.
"""

from __future__ import annotations

import time
from pathlib import Path

from specchat.config import Config, Random, SamplingConfig

GAMMAS = (4, 8)
NGRAM = "ngram"  # the gamma of the n-gram row
NGRAM_TOKENS = 16  # tokens an n-gram draft copies at most, as llama-speculative-simple --spec-draft-n-max 16


def unavailable(cfg: Config) -> str:
    """Why llama.cpp rows cannot run ('' when they can)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 'llama.cpp rows skipped: llama-cpp-python is not installed (pip install -e ".[llamacpp]")'
    if not gguf_path(cfg.target.source):
        return f"llama.cpp rows skipped: the target {cfg.target.source} is not a GGUF file"
    return ""


def gguf_path(source: str) -> Path | None:
    """The GGUF file of a bundled: or .gguf source (assembled from its parts if needed), else None."""
    from specchat.loading.sources import resolve_source

    resolved = resolve_source(source)
    if resolved.kind == "gguf":
        return Path(resolved.location)
    if resolved.kind == "bundled":
        from specchat.loading.assets import bundled_gguf_path

        return bundled_gguf_path(resolved.location)
    return None


class GreedyDrafter:
    """A llama-cpp-python draft model: another GGUF drafting `gamma` greedy tokens from its own cache."""

    def __init__(self, llama):
        self.llama = llama
        self.gamma = 4

    def __call__(self, input_ids, **_kwargs):
        import numpy as np

        ids = [int(i) for i in input_ids]
        self._catch_up(ids)
        drafts = []
        width = self.llama.n_vocab()
        for index in range(self.gamma):  # the context holds the logits of the last token fed
            token = int(np.argmax(np.ctypeslib.as_array(self.llama._ctx.get_logits(), shape=(width,))))
            drafts.append(token)
            if index + 1 < self.gamma:  # the last draft is fed on the next call, if kept
                self.llama.eval([token])
        return np.array(drafts, dtype=np.intc)

    def _catch_up(self, ids: list[int]) -> None:
        """Keep the cached prefix shared with ids (at least one token is re-fed), feed the rest."""
        seen = self.llama.input_ids[: self.llama.n_tokens].tolist()
        keep = 0
        while keep < min(len(seen), len(ids) - 1) and seen[keep] == ids[keep]:
            keep += 1
        self.llama.n_tokens = keep
        self.llama._ctx.kv_cache_seq_rm(-1, keep, -1)
        self.llama.eval(ids[keep:])


class LlamaCppRunner:
    """llama.cpp's target-only and speculative generation on the configured pair's GGUF files."""

    def __init__(self, cfg: Config, threads: int, context: int = 4096):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

        common = dict(n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)
        target = str(gguf_path(cfg.target.source))
        self.target = Llama(model_path=target, **common)
        # A draft model's loop keeps every row's logits: with logits_all unset, llama-cpp-python sizes them for
        # n_batch (512) rows and fails once a reply passes the 512th token ("could not broadcast").
        drafting = dict(common, logits_all=True)
        self.ngram = Llama(
            model_path=target, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=NGRAM_TOKENS), **drafting
        )
        self.drafter = None
        drafter = gguf_path(cfg.drafter.source) if cfg.drafter.source else None
        if drafter:
            draft_llama = Llama(model_path=str(drafter), **common)
            self.drafter = type("Drafter", (GreedyDrafter, LlamaDraftModel), {})(draft_llama)
            self.speculative = Llama(model_path=target, draft_model=self.drafter, **drafting)

    def generate(self, ids: list[int], sampling: SamplingConfig, eos_ids, gamma: int | str | None):
        """(new ids, seconds) for one reply; gamma None: target-only, NGRAM: prompt-lookup drafts."""
        if gamma is None:
            llama = self.target
        elif gamma == NGRAM:
            llama = self.ngram
        else:
            llama, self.drafter.gamma = self.speculative, gamma
        llama.reset()
        llama.set_seed(0 if isinstance(sampling.seed, Random) else sampling.seed)
        options = _options(sampling)
        start, new = time.perf_counter(), []
        for token in llama.generate(ids, reset=True, **options):
            new.append(int(token))
            if token in eos_ids or len(new) >= sampling.max_new_tokens:
                break
        return tuple(new), time.perf_counter() - start


def _options(sampling: SamplingConfig) -> dict:
    """llama.cpp's sampler set to specchat's settings (its penalties look back over 64 ids, as specchat's do)."""
    penalties = dict(repeat_penalty=sampling.repeat_penalty, presence_penalty=sampling.presence_penalty)
    if sampling.is_greedy:
        return dict(temp=0.0, top_k=0, top_p=1.0, min_p=0.0, **penalties)
    return dict(
        temp=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p, **penalties
    )
