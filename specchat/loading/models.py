"""Load a target/drafter pair from a Config, as a pipeline of three stages, each a function of its own module:

1. resolve (plan.py): each model's source, device, dtype and quantization, settled before anything slow;
2. materialise: the checkpoint (checkpoint.py: a bundled model's GGUF assembled, a GGUF converted, each once and
   cached), its weights (weights.py), specchat's own quantization (quantize.py, its weights stored once), the
   tokenizer (shared_tokenizer.py), every weight made resident (resident.py);
3. attach (attach.py): what runs the model (the lean forward, the compiled layer loop, the w4a8 kernel), labelled.

Sources: `bundled:<name>` (GGUF assembled from pip packages), a `.gguf` file (converted once
into a cached safetensors checkpoint), a local directory, or a hub id (the ordinary
transformers cache). Every failure is a ModelLoadError whose message is one line.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from torch import nn

from specchat import early_pages
from specchat.config import Config, ModelConfig
from specchat.errors import ModelLoadError
from specchat.loading.attach import attach, pair_sampler
from specchat.loading.checkpoint import checkpoint_for
from specchat.loading.devices import dtype_name
from specchat.loading.draft_head import attach_draft_head
from specchat.loading.gguf.header import kept_headers
from specchat.loading.huge_pages import huge_pages_offered, into_huge_pages, outside_regions, w4a8_tensors
from specchat.loading.memory_need import check_memory
from specchat.loading.pair_check import PairCheck, judge_pair
from specchat.loading.plan import ModelPlan, plan_model, plan_pair
from specchat.loading.quantize import quantize
from specchat.loading.resident import model_tensors, populate, read_whole, tensor_bytes
from specchat.loading.shared_tokenizer import PLAIN_TURN_STOP, shared_tokenizer
from specchat.loading.tokenizer_check import output_width, stop_ids
from specchat.loading.weights import load_weights
from specchat.memory import release_freed_memory
from specchat.progress import Progress, report
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.pair import Pair

__all__ = ["ModelLoadError", "ModelFacts", "LoadedPair", "load_pair", "load_model"]


@dataclass
class ModelFacts:
    name: str
    source: str
    params: int
    dtype: str
    quantization: str  # none | 4bit | 8bit | int8 | w8a8 | the GGUF's type, e.g. Q4_K_M(→int8)
    device: str  # cpu | cuda:0 | "cuda:0,cuda:1" when spread by device_map
    memory_bytes: int
    load_s: float
    template: str = "own"  # own | plain (the tokenizer had none; specchat's User:/Assistant: one)
    backend: str = (
        "transformers"  # lean | lean (compiled layers) | transformers | "transformers (why the lean one could not run)"
    )
    kernel: str = ""  # the w4a8 kernel's code path (avx512-vnni, avx-vnni, avx2, portable); "" without it
    identity: str = ""  # what the weights are (a GGUF's sha256, a folder's fingerprint): the draft head's key
    draft_head: str = ""  # the draft head trained for it (loading/draft_head.py), for the banner; "" without one


@dataclass(frozen=True, kw_only=True)
class LoadedPair(Pair):
    """A Pair (its drafter_tokenizer set where the drafter drafts text: pair_check.py) and what loading found."""

    context_limit: int
    target_facts: ModelFacts
    drafter_facts: ModelFacts | None
    pair_check: PairCheck | None = None  # how the drafter's tokens relate to the target's (None: no drafter)


def load_pair(cfg: Config, progress: Progress | None = None) -> LoadedPair:
    """Load the target and (when configured) the drafter, check they fit together."""
    _check_drafter_needed(cfg)
    with kept_headers():  # each GGUF's header read once for the planning, conversion and tiling
        plans = plan_pair(cfg, progress)  # before any slow work: a mode or a device that cannot run here fails now
        check_memory(plans, cfg)  # and a pair that will not fit in memory
        tokenizers: dict = {}  # one tokenizer for checkpoints with the same tokenizer files
        loaded = {}
        for plan in plans:
            loaded[plan.role] = load_planned(plan, progress, tokenizers)
            release_freed_memory()  # the target's temporaries back to the system before the drafter's come
    early_pages.finish()  # what was faulted in ahead and not taken unmapped; the sizes taken remembered
    target, tokenizer, target_facts = loaded["target"]
    drafter, drafter_tok, drafter_facts = loaded.get("drafter", (None, None, None))
    verdict = judge_pair(tokenizer, drafter_tok, drafter, drafter_facts.name) if drafter is not None else None
    if output_width(target) < len(tokenizer):
        raise ModelLoadError(
            f"target {target_facts.name} scores {output_width(target)} token ids but its "
            f"tokenizer has {len(tokenizer)}; the checkpoint is inconsistent"
        )
    eos = stop_ids(tokenizer, target.generation_config.eos_token_id, cfg.speculation.extra_eos)
    release_freed_memory()
    return LoadedPair(
        target,
        drafter,
        tokenizer,
        eos,
        len(tokenizer),
        drafter_tok if verdict and verdict.text_drafting else None,
        pair_sampler(target_facts.kernel, drafter_facts.kernel if drafter_facts else ""),
        context_limit=context_limit(cfg, target, tokenizer),
        target_facts=target_facts,
        drafter_facts=drafter_facts,
        pair_check=verdict,
    )


def load_model(
    mc: ModelConfig,
    progress: Progress | None = None,
    role: str = "target",
    tokenizers: dict | None = None,
    kv_cache: str = "float16",
):
    """One model, eval mode, with its tokenizer and banner facts: (model, tokenizer, ModelFacts).
    `tokenizers` (digest of the tokenizer files -> tokenizer, template) lets a pair share one;
    kv_cache: how the compiled layer loop stores keys and values (runtime.kv_cache)."""
    return load_planned(plan_model(mc, role, kv_cache=kv_cache, progress=progress), progress, tokenizers)


def in_huge_pages(model: nn.Module, label: str, progress: Progress | None) -> None:
    """The model's w4a8 tiles moved into 2 MB pages where the system offers them (loading/huge_pages.py), before
    the compiled layer loop takes their addresses."""
    tiles = outside_regions(w4a8_tensors(model))  # not those read into 2 MB pages already (tile_arena.py)
    if tiles and huge_pages_offered():
        report(progress, f"moving {label}'s weights into 2 MB pages", None)
        into_huge_pages(tiles)


def load_planned(plan: ModelPlan, progress: Progress | None = None, tokenizers: dict | None = None):
    """The materialise and attach stages of one planned model: (model, tokenizer, ModelFacts)."""
    start = time.perf_counter()
    with kept_headers():
        checkpoint = checkpoint_for(plan, progress)
        report(progress, f"loading {plan.label}", None)
        weights = load_weights(checkpoint, plan)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specchat-tokenizer") as beside:
            # read while quantize's compiled work runs without the GIL: where the tiles' pages are faulted in here
            # (no region faulted in ahead: early_pages.py), 1.3 s off a 7B's warm start
            tokenizing = beside.submit(shared_tokenizer, checkpoint, plan, tokenizers)
            quantized = quantize(weights.model, checkpoint, plan, progress)
        tokenizer, template = tokenizing.result()
    model = quantized.model
    tensors = model_tensors(model)
    populate(read_whole(model, tensors))  # mapped weights: resident now, not a page fault at a time
    memory = tensor_bytes(tensors)
    in_huge_pages(model, plan.label, progress)
    attached = attach(model, plan, progress)
    draft_head = attach_draft_head(model, checkpoint.identity, progress) if plan.role == "target" else ""
    facts = ModelFacts(
        plan.source.name,
        plan.written,
        weights.params,
        dtype_name(quantized.dtype),
        quantized.label,
        ",".join(sorted({str(p.device) for p in model.parameters()})),
        memory,
        round(time.perf_counter() - start, 2),
        template,
        attached.backend,
        attached.kernel,
        checkpoint.identity,
        draft_head,
    )
    return model, tokenizer, facts


def reply_stops(facts: ModelFacts) -> tuple[str, ...]:
    """The text that ends a reply: the plain template's next user turn, for a model that chats in it
    (a model's own template ends its turns with a stop token instead)."""
    return (PLAIN_TURN_STOP,) if getattr(facts, "template", "own") == "plain" else ()


def context_limit(cfg: Config, target, tokenizer) -> int:
    """ui.context_limit when set, else the target's maximum positions."""
    if cfg.ui.context_limit > 0:
        return cfg.ui.context_limit
    config = target.config.get_text_config()
    for attr in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", 0)
    if 0 < limit < 10_000_000:
        return int(limit)
    raise ModelLoadError(
        "cannot tell the target's context length from its config; set ui.context_limit (e.g. ui.context_limit=2048)"
    )


def _check_drafter_needed(cfg: Config) -> None:
    problem = drafter_needed(
        bool(cfg.drafter.source), cfg.speculation.mode, cfg.speculation.compare, cfg.speculation.drafter
    )
    if problem:
        raise ModelLoadError(
            f"{problem}, and drafter.source is empty: set drafter.source, use "
            f"speculation.drafter=lookup (no model), or speculation.mode=target"
        )
