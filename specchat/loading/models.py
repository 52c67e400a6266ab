"""Load a target/drafter pair from a Config: resolve each source, place and quantize it, check the pair.

Sources: `bundled:<name>` (GGUF assembled from pip packages), a `.gguf` file (converted once
into a cached safetensors checkpoint), a local directory, or a hub id (the ordinary
transformers cache). Every failure is a ModelLoadError whose message is one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specchat.config import INVARIANT_MODES, W4A8_MODES, Config, ModelConfig, drafter_needed
from specchat.errors import ModelLoadError, one_line
from specchat.loading.devices import check_device_types, dtype_name, placement_kwargs, resolve_device, resolve_dtype
from specchat.loading.gguf.slim import check_materialized, parameter_count
from specchat.loading.gguf.slim import load as load_slim
from specchat.loading.pair_check import PairCheck, judge_pair
from specchat.loading.quantization_choice import choose, choose_quantizations
from specchat.loading.resident import model_tensors, populate, read_whole, tensor_bytes
from specchat.loading.shared_tokenizer import tokenizer_digest
from specchat.loading.sources import Source, resolve_source
from specchat.loading.tokenizer_check import output_width, stop_ids
from specchat.memory import release_freed_memory
from specchat.progress import Progress, report
from specchat.spec.sampling import ProbsFn, compiled_probs, probs_from_logits

OFFLINE_HINT = (
    "if there is no network, set HF_HUB_OFFLINE=1 to use the local hub cache, "
    "or point the source at a local directory or .gguf file"
)
# Used only for models whose tokenizer has no chat template (base models such as gpt2);
# ModelFacts.template says so, for the banner.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
PLAIN_TURN_STOP = "\nUser:"  # a base model under PLAIN_TEMPLATE that writes this has begun the user's next turn

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


@dataclass
class LoadedPair:
    target: Any
    drafter: Any | None
    tokenizer: Any
    eos_ids: set[int]
    vocab_size: int
    context_limit: int
    target_facts: ModelFacts
    drafter_facts: ModelFacts | None
    drafter_tokenizer: Any = None  # the drafter's own tokenizer where it drafts text (pair_check.py), else None
    pair_check: PairCheck | None = None  # how the drafter's tokens relate to the target's (None: no drafter)
    probs: ProbsFn = probs_from_logits  # what computes sampling probabilities: the compiled module's with w4a8


@dataclass(frozen=True)
class Checkpoint:
    """Where from_pretrained reads a model: a local directory, or a hub id."""

    location: str
    local: bool
    quantization: str  # what the checkpoint itself is: none, or a GGUF type
    identity: str = ""  # what the weights are, for caches derived from them (a sha256, a fingerprint)
    gguf_source: Source | None = None  # the GGUF file (or bundled model) it was converted from
    slim: bool = False  # only the float tensors of a w4a8 model (loading/gguf/slim.py); the rest comes quantized


def load_pair(cfg: Config, progress: Progress | None = None) -> LoadedPair:
    """Load the target and (when configured) the drafter, check they fit together."""
    _check_drafter_needed(cfg)
    cfg = choose_quantizations(cfg, progress)  # before any slow work: a mode that cannot run here fails now
    if cfg.drafter.source:
        check_device_types(resolve_device(cfg.target.device), resolve_device(cfg.drafter.device))
    drafter, drafter_tok, drafter_facts = None, None, None
    tokenizers: dict = {}  # one tokenizer for checkpoints with the same tokenizer files
    kv = cfg.runtime.kv_cache
    if drafter_loads_first(cfg):
        drafter, drafter_tok, drafter_facts = load_model(cfg.drafter, progress, "drafter", tokenizers, kv)
    target, tokenizer, target_facts = load_model(cfg.target, progress, "target", tokenizers, kv)
    if cfg.drafter.source and drafter is None:
        drafter, drafter_tok, drafter_facts = load_model(cfg.drafter, progress, "drafter", tokenizers, kv)
    verdict = judge_pair(tokenizer, drafter_tok, drafter, drafter_facts.name) if drafter is not None else None
    _check_target_width(target, tokenizer, target_facts.name)
    eos = stop_ids(tokenizer, target.generation_config.eos_token_id, cfg.speculation.extra_eos)
    release_freed_memory()
    return LoadedPair(
        target,
        drafter,
        tokenizer,
        eos,
        len(tokenizer),
        context_limit(cfg, target, tokenizer),
        target_facts,
        drafter_facts,
        drafter_tok if verdict and verdict.text_drafting else None,
        verdict,
        _probs(target_facts, drafter_facts),
    )


def _probs(target_facts: ModelFacts, drafter_facts: ModelFacts | None) -> ProbsFn:
    """Where the pair runs on the compiled w4a8 module, its sampling probabilities too (one pass over a row)."""
    if not (target_facts.kernel or (drafter_facts is not None and drafter_facts.kernel)):
        return probs_from_logits
    from specchat.kernels.build import q4_kernel  # as the rest of this file: built where w4a8 asks for it

    return compiled_probs(q4_kernel().top_p_probs)


def drafter_loads_first(cfg: Config) -> bool:
    """A target spread by device_map = "auto" fills each GPU's free memory (as accelerate measures it) up to its
    max_memory; the drafter is placed before it, so that the target's map leaves the drafter's weights room."""
    return bool(cfg.drafter.source) and cfg.target.device_map == "auto"


def load_model(
    mc: ModelConfig,
    progress: Progress | None = None,
    role: str = "target",
    tokenizers: dict | None = None,
    kv_cache: str = "bfloat16",
):
    """One model, eval mode, with its tokenizer and banner facts: (model, tokenizer, ModelFacts).
    `tokenizers` (digest of the tokenizer files -> tokenizer, template) lets a pair share one;
    kv_cache: how the compiled layer loop stores keys and values (runtime.kv_cache)."""
    start = time.perf_counter()
    source = resolve_source(mc.source)
    device = resolve_device(mc.device)
    mc = choose(mc, role, progress=progress)  # auto settled; a w4a8 mode checked to run here
    mc = runnable_quantization(mc, device, role, progress)
    dtype = resolve_dtype(mc.dtype, device, mc.quantization)
    if mc.quantization == "8bit":
        from specchat.loading.hfquiet import quiet_bitsandbytes_casts

        quiet_bitsandbytes_casts()
    kwargs = placement_kwargs(mc, role, device, dtype)
    checkpoint = checkpoint_for(source, mc, dtype, progress)
    report(progress, f"loading {role} {source.name}", None)
    model = _load_weights(checkpoint, mc, source, kwargs)
    params = parameter_count(model)  # before int8 turns weights into buffers
    _quantize_after_loading(model, mc, checkpoint, dtype, f"{role} {source.name}", progress)
    if checkpoint.slim:
        check_materialized(model, f"{role} {source.name}")
        _drop_assembled(source)
    if mc.quantization in INVARIANT_MODES:  # the int8 kernels return float32: norms and attention stay in it
        model, dtype = model.float(), torch.float32
    tokenizer, template = _shared_tokenizer(checkpoint, mc, source, tokenizers)
    tensors = model_tensors(model)
    populate(read_whole(model, tensors))  # mapped weights: resident now, not a page fault at a time
    facts = ModelFacts(
        source.name,
        mc.source,
        params,
        dtype_name(dtype),
        _quant_label(checkpoint.quantization, mc.quantization),
        _device_label(model),
        tensor_bytes(tensors),
        round(time.perf_counter() - start, 2),
        template,
        _backend(model, mc, kv_cache, f"{role} {source.name}", progress),
        _kernel_path(mc),
    )
    return model, tokenizer, facts


def _drop_assembled(source: Source) -> None:
    """A bundled model loaded slim (its quantized cache written) needs its assembled GGUF no more."""
    if source.kind == "bundled":
        from specchat.loading import assets

        assets.drop_assembled(source.location)


def _kernel_path(mc: ModelConfig) -> str:
    from specchat.kernels.build import running_path

    return running_path() if mc.quantization in W4A8_MODES else ""


def _backend(model, mc: ModelConfig, kv_cache: str, label: str, progress: Progress | None) -> str:
    """Attach the lean forward when asked and possible; the label the banner shows. w4a8 models get
    the compiled layer loop too, with its keys and values stored as kv_cache says. A model the lean forward
    cannot run gets one notice line naming the slower path."""
    from specchat.loading.hfquiet import quiet_renamed_cache_argument

    if mc.backend != "lean":
        quiet_renamed_cache_argument()
        return mc.backend
    from specchat.runtime.lean import attach_lean
    from specchat.spec.model_io import RUNNER

    native_layers = None
    if mc.quantization in W4A8_MODES:
        from specchat.kernels.build import q4_kernel

        native_layers = q4_kernel().LeanLayers
    reason = attach_lean(model, native_layers, kv_cache)
    if reason:
        quiet_renamed_cache_argument()
        report(progress, f"{label} runs on transformers' forward, slower: {reason}", None)
        return f"transformers ({reason})"
    return "lean (compiled layers)" if not getattr(model, RUNNER).native_reason else "lean"


def runnable_quantization(mc: ModelConfig, device: str, role: str, progress: Progress | None = None) -> ModelConfig:
    """specchat's own int8 modes are for the CPU: elsewhere the model loads unquantized, with one notice.

    w8a8 runs on fbgemm, a CPU kernel; w4a8 on specchat's own AVX2 kernel. Weight-only int8 runs on a
    GPU too, but dequantizes every weight on every call there, which is slower than the 16-bit weights
    it replaces (use 4bit or 8bit there)."""
    if mc.quantization not in ("int8", *INVARIANT_MODES) or torch.device(device).type == "cpu":
        return mc
    why = (
        "is fast on the CPU only (elsewhere it dequantizes every weight on every call)"
        if mc.quantization == "int8"
        else "runs on the CPU only"
    )
    report(progress, f"{role}: quantization {mc.quantization} {why}; loading it unquantized on {device}", None)
    return dataclasses.replace(mc, quantization="none")


def _quantize_after_loading(
    model, mc: ModelConfig, checkpoint: Checkpoint, dtype: torch.dtype, label: str, progress: Progress | None
) -> None:
    """specchat's own modes, cached once quantized: weight-only int8, or int8×int8 / 4-bit×int8 with
    batch-invariant attention."""
    if mc.quantization not in ("int8", *INVARIANT_MODES):
        return
    from specchat.loading import quantized_cache

    if mc.quantization in W4A8_MODES:  # compiled before the weights are quantized, so its wait is said first
        from specchat.kernels.build import q4_kernel

        q4_kernel(progress)
    path = quantized_cache.cache_path(checkpoint.identity, dtype_name(dtype), mc.quantization)
    notice = quantized_cache.quantize_with_cache(
        model, path, label, mc.quantization, progress, gguf=_gguf_file(checkpoint, progress)
    )
    if notice:
        report(progress, notice, None)
    unfit = quantized_cache.unquantized_layers(model, mc.quantization)
    if unfit:
        report(
            progress,
            f"{label}: {len(unfit)} linear layer(s) stay unquantized ({unfit[0]}, ...): "
            f"{mc.quantization} takes input widths that are multiples of 64",
            None,
        )
    if mc.quantization in INVARIANT_MODES:
        from specchat.runtime.attention import use_batch_invariant_attention

        use_batch_invariant_attention(model)


def checkpoint_for(source: Source, mc: ModelConfig, dtype: torch.dtype, progress: Progress | None) -> Checkpoint:
    """A directory (or hub id) from_pretrained can read, converting GGUF files once if needed."""
    from specchat.loading.gguf import convert as gguf_convert

    if mc.revision and source.kind != "hub":
        raise ModelLoadError(f"revision = {mc.revision!r} only applies to hub ids, not to {mc.source}")
    if source.kind == "hub":
        identity = hashlib.sha256(f"{source.location}@{mc.revision}".encode()).hexdigest()
        return Checkpoint(source.location, local=False, quantization="none", identity=identity)
    if source.kind == "dir":
        if not (Path(source.location) / "config.json").is_file():
            raise ModelLoadError(
                f"{source.location} has no config.json; a model directory comes "
                f"from save_pretrained (or give a .gguf file)"
            )
        from specchat.loading.quantized_cache import directory_identity

        return Checkpoint(
            source.location, local=True, quantization="none", identity=directory_identity(Path(source.location))
        )
    directory = _converted(source, dtype, mc.quantization in W4A8_MODES, progress)
    meta = gguf_convert.read_meta(directory)
    return Checkpoint(
        str(directory),
        local=True,
        quantization=meta["quantization"],
        identity=directory.name,
        gguf_source=source,
        slim=bool(meta.get("slim")),
    )


def _gguf_file(checkpoint: Checkpoint, progress: Progress | None):
    """A function giving the GGUF file a checkpoint was converted from (found only when called), or None."""
    source = checkpoint.gguf_source
    if source is None:
        return None
    if source.kind == "bundled":
        from specchat.loading import assets

        return lambda: assets.bundled_gguf_path(source.location, progress)
    return lambda: Path(source.location)


def _converted(source: Source, dtype: torch.dtype, w4a8: bool, progress: Progress | None) -> Path:
    """The cached conversion of a GGUF source: slim for the w4a8 modes where the file streams (loading/gguf/slim.py),
    else full. Only when it is not cached is a bundled model's file assembled, or a file's header read."""
    from specchat.loading import assets
    from specchat.loading.gguf import convert as gguf_convert
    from specchat.loading.gguf.tensors import streamable

    bundled = source.kind == "bundled"
    if bundled:
        sha = assets.bundled_model(source.location).sha256
    else:
        sha = gguf_convert.gguf_digest(Path(source.location), progress)
    if gguf_convert.is_converted(sha, dtype, w4a8):
        return gguf_convert.converted_dir(sha, dtype, w4a8)
    gguf = assets.bundled_gguf_path(source.location, progress) if bundled else Path(source.location)
    slim = w4a8 and streamable(gguf)
    return gguf_convert.ensure_converted(gguf, sha, dtype, source.name, progress, slim)


def _from_pretrained_kwargs(checkpoint: Checkpoint, mc: ModelConfig) -> dict:
    kwargs: dict = {"trust_remote_code": mc.trust_remote_code}
    if checkpoint.local:
        kwargs["local_files_only"] = True
    elif mc.revision:
        kwargs["revision"] = mc.revision
    return kwargs


def _load_weights(checkpoint: Checkpoint, mc: ModelConfig, source: Source, placement: dict):
    """The model from its checkpoint; a slim one's quantized layers still empty (on the meta device).
    A slim checkpoint is for w4a8, which runs on the CPU only: there is nothing to place."""
    from transformers import AutoModelForCausalLM

    from specchat.loading.hfquiet import quiet_transformers

    try:
        with quiet_transformers():
            if checkpoint.slim:
                return load_slim(Path(checkpoint.location))
            model = AutoModelForCausalLM.from_pretrained(
                checkpoint.location, **_from_pretrained_kwargs(checkpoint, mc), **placement
            )
    except ModelLoadError:
        raise
    except Exception as err:  # any failure inside transformers becomes one line for the user
        raise _load_error(err, source, "the model") from err
    return model.eval()


def _shared_tokenizer(checkpoint: Checkpoint, mc: ModelConfig, source: Source, tokenizers: dict | None):
    """The tokenizer already read from identical files (local checkpoints only), else a new one."""
    shareable = tokenizers is not None and checkpoint.local
    key = tokenizer_digest(checkpoint.location, mc.trust_remote_code) if shareable else None
    if key is None:
        return _load_tokenizer(checkpoint, mc, source)
    if key not in tokenizers:
        tokenizers[key] = _load_tokenizer(checkpoint, mc, source)
    return tokenizers[key]


def _load_tokenizer(checkpoint: Checkpoint, mc: ModelConfig, source: Source):
    """The tokenizer, and whether its chat template is its own or specchat's plain one."""
    from transformers import AutoTokenizer

    from specchat.loading.hfquiet import quiet_transformers

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(checkpoint.location, **_from_pretrained_kwargs(checkpoint, mc))
    except Exception as err:  # any failure inside transformers becomes one line for the user
        raise _load_error(err, source, "the tokenizer") from err
    if getattr(tokenizer, "chat_template", None):
        return tokenizer, "own"
    tokenizer.chat_template = plain_template(tokenizer)
    return tokenizer, "plain"


def plain_template(tokenizer) -> str:
    """PLAIN_TEMPLATE, opened with the BOS token when the tokenizer puts one before ordinary text (Llama-2 does,
    gpt2 and bloom do not): apply_chat_template adds no special tokens of its own."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = tokenizer("a")["input_ids"]
    if bos is not None and ids and ids[0] == bos:
        return "{{ bos_token }}" + PLAIN_TEMPLATE
    return PLAIN_TEMPLATE


def reply_stops(facts: ModelFacts) -> tuple[str, ...]:
    """The text that ends a reply: the plain template's next user turn, for a model that chats in it
    (a model's own template ends its turns with a stop token instead)."""
    return (PLAIN_TURN_STOP,) if getattr(facts, "template", "own") == "plain" else ()


def _load_error(err: Exception, source: Source, what: str) -> ModelLoadError:
    if source.kind == "hub":
        return ModelLoadError(
            f"cannot load {what} of {source.location} from the Hugging Face hub ({one_line(err)}); {OFFLINE_HINT}"
        )
    return ModelLoadError(f"cannot load {what} of {source.name} from {source.location}: {one_line(err)}")


def _quant_label(checkpoint_quant: str, bnb: str) -> str:
    if bnb == "none":
        return checkpoint_quant
    return bnb if checkpoint_quant == "none" else f"{checkpoint_quant}→{bnb}"


def _device_label(model) -> str:
    return ",".join(sorted({str(p.device) for p in model.parameters()}))


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


def _check_target_width(target, tokenizer, name: str) -> None:
    if output_width(target) < len(tokenizer):
        raise ModelLoadError(
            f"target {name} scores {output_width(target)} token ids but its "
            f"tokenizer has {len(tokenizer)}; the checkpoint is inconsistent"
        )
