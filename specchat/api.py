"""specchat from Python: exact speculative decoding on transformers models you have already loaded.

    import specchat
    result = specchat.speculative_generate(input_ids, drafter, target, tokenizer, gamma=4)
    ids, alpha = result            # unpacks like the research repos' (ids, acceptance_rate)

The functions here build the chat's own Engine on the models given (with fresh caches each call),
so the output, the provenance of every token and the statistics are exactly what the chat shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specchat.config import AUTO, GAMMA_MAX, RANDOM, Auto, Config, Gamma, Mode, SamplingConfig, SpeculationConfig
from specchat.settings import problem
from specchat.speculative.detok import Tokenizer
from specchat.speculative.engine import Engine
from specchat.speculative.events import Event, ReplyDone, Token
from specchat.speculative.metrics import ReplyStats
from specchat.speculative.model_io import Model
from specchat.speculative.pair import Pair

if TYPE_CHECKING:
    from specchat.loading.models import LoadedPair

DEFAULT_MAX_NEW_TOKENS = 128
PromptIds = Sequence[int] | torch.Tensor  # token ids, or a 1-D or [1, n] tensor of them


@dataclass(frozen=True)
class Generation:
    """One generated reply. `ids` holds the new tokens only (not the prompt); `tokens` says which
    model produced each one (Token: id, text, origin); `stats` is the chat's ReplyStats."""

    ids: list[int]
    text: str | None
    tokens: list[Token]
    stats: ReplyStats
    stop_reason: str  # "eos" | "max_tokens"

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts ÷ drafted tokens (0 when nothing was drafted)."""
        return self.stats.acceptance_rate

    def __iter__(self) -> Iterator[Any]:
        """`ids, acceptance_rate = speculative_generate(...)`, as the research repos return."""
        return iter((self.ids, self.acceptance_rate))


@dataclass(frozen=True)
class Options:
    """The keywords the functions here take, with their defaults. `gamma`: drafts a step, 0-16 or "auto";
    `temperature` 0 is greedy; `top_k` 0 and `top_p` 1 are off; `eos_token_ids` default to the tokenizer's and the
    target's generation config's; `seed=None` draws a fresh seed; `drafter_vocab` > 0 lets the drafter score only
    ids below it (plus ids seen and stop ids), which stays exact. autoregressive_generate takes all but the
    drafter's (DRAFTER_KEYWORDS)."""

    gamma: int | str = 4
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    eos_token_ids: int | Iterable[int] | None = None
    seed: int | None = 0
    drafter_vocab: int = 0


DRAFTER_KEYWORDS = ("gamma", "drafter_vocab")


def speculative_generate(
    input_ids: PromptIds, drafter: Model | None, target: Model, tokenizer: Tokenizer | None = None, **options: Any
) -> Generation:
    """Generate after `input_ids` (a list of ids, or a 1-D / [1, n] tensor): `drafter` proposes `gamma` tokens a
    step, `target` verifies them in one forward, and the rejection rule keeps the output distributed exactly as the
    target's (greedy at temperature 0). `tokenizer` (optional) gives `text`; the keywords are Options'. Bad
    arguments raise ValueError (an unknown keyword: TypeError)."""
    if drafter is None:
        raise ValueError("speculative_generate needs a drafter model; use autoregressive_generate without one")
    return _collect(stream(input_ids, drafter, target, tokenizer, **options), tokenizer)


def autoregressive_generate(
    input_ids: PromptIds, target: Model, tokenizer: Tokenizer | None = None, **options: Any
) -> Generation:
    """The target alone, one token per forward, through the same engine: the reference that
    speculative_generate equals (greedy) or matches in distribution (sampled). The keywords are Options' but the
    drafter's."""
    _options(options, DRAFTER_KEYWORDS)
    return _collect(stream(input_ids, None, target, tokenizer, **options), tokenizer)


def stream(
    input_ids: PromptIds, drafter: Model | None, target: Model, tokenizer: Tokenizer | None = None, **options: Any
) -> Iterator[Event]:
    """The engine's events as they happen (arguments as speculative_generate; drafter=None runs the
    target alone): Token (id, text delta, origin), Rejected (drafts the target refused), StepDone,
    and a final ReplyDone with the stats. Without a tokenizer every text is ''."""
    ids, chosen = _prompt_ids(input_ids), _options(options)
    sampling = _sampling(chosen)
    speculation = SpeculationConfig(
        gamma=_gamma(chosen.gamma, drafter),
        mode=Mode.SPEC if drafter is not None else Mode.TARGET,
        drafter_vocab=_non_negative("drafter_vocab", chosen.drafter_vocab),
    )
    engine = _engine(drafter, target, tokenizer, chosen.eos_token_ids)
    return engine.stream(ids, sampling, speculation)


def load_pair(config: str | None = None, **overrides: Any) -> LoadedPair:
    """The chat's loader: the bundled pair by default, or a pair config TOML, with any config key
    overridden, e.g. load_pair(**{"target.dtype": "float32"}). Returns a LoadedPair whose
    .drafter, .target and .tokenizer the functions above take."""
    from specchat.loading.models import load_pair as load
    from specchat.settings import load_config, set_from_text, with_value

    cfg: Config = load_config(config)
    for key, value in overrides.items():
        cfg = set_from_text(cfg, key, value) if isinstance(value, str) else with_value(cfg, key, value)
    return load(cfg)


# ----- arguments, checked once, one clear message each --------------------------------------------
def _prompt_ids(input_ids: PromptIds) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2 and input_ids.shape[0] == 1:
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise ValueError(
                f"input_ids must be a list of ids or a 1-D (or [1, n]) tensor, got shape {tuple(input_ids.shape)}"
            )
        input_ids = input_ids.tolist()
    ids = list(input_ids)
    if not ids:
        raise ValueError("input_ids is empty: give at least one token id")
    if not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError("input_ids must hold non-negative integer token ids")
    return ids


def _options(given: dict[str, Any], left_out: tuple[str, ...] = ()) -> Options:
    """The Options the keywords `given` choose; TypeError naming a keyword no function here takes (or one in
    `left_out`)."""
    names = [field.name for field in dataclasses.fields(Options) if field.name not in left_out]
    unknown = [name for name in given if name not in names]
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}; the keywords are {', '.join(names)}")
    return Options(**given)


def _sampling(options: Options) -> SamplingConfig:
    temperature, top_p, max_new_tokens, seed = options.temperature, options.top_p, options.max_new_tokens, options.seed
    if not temperature >= 0:
        raise ValueError(f"temperature must be ≥ 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer ≥ 1, got {max_new_tokens!r}")
    if seed is not None and not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, or None for a fresh one, got {seed!r}")
    return SamplingConfig(
        temperature=float(temperature),
        top_k=_non_negative("top_k", options.top_k),
        top_p=float(top_p),
        seed=RANDOM if seed is None or seed < 0 else seed,
        max_new_tokens=max_new_tokens,
    )


def _gamma(gamma: int | str | Auto, drafter: Model | None) -> Gamma:
    """The config's gamma for the API's argument: 0-16, "auto" or AUTO; checked by the config's own validator."""
    if drafter is None:
        return 0
    value = AUTO if gamma == "auto" else gamma
    # the API's own words: auto is the Python string there (any other string fits no gamma)
    if isinstance(value, str) or problem("speculation.gamma", value):
        raise ValueError(f"gamma must be an integer from 0 to {GAMMA_MAX} or 'auto', got {gamma!r}")
    return value


def _non_negative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer ≥ 0 (0 = off), got {value!r}")
    return value


def _engine(
    drafter: Model | None, target: Model, tokenizer: Tokenizer | None, eos_token_ids: int | Iterable[int] | None
) -> Engine:
    """An Engine with fresh caches on the caller's models. Models from load_pair run specchat's lean
    forward; other models run transformers' own (the caller's model objects are left as they are)."""
    from specchat.loading.tokenizer_check import output_width

    vocab_size = len(tokenizer) if tokenizer is not None else output_width(target)
    if drafter is not None and output_width(drafter) < vocab_size:
        raise ValueError(
            f"the drafter scores {output_width(drafter)} token ids but the target's vocabulary has "
            f"{vocab_size}: the two models must share a tokenizer"
        )
    text = tokenizer if tokenizer is not None else _NoText(vocab_size)
    return Engine.for_pair(Pair(target, drafter, text, _eos_ids(eos_token_ids, tokenizer, target), vocab_size))


def _eos_ids(eos_token_ids: int | Iterable[int] | None, tokenizer: Tokenizer | None, target: Model) -> set[int]:
    if eos_token_ids is not None:
        given = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
        return {int(i) for i in given}
    found = [getattr(tokenizer, "eos_token_id", None)]
    config_eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    found += config_eos if isinstance(config_eos, Iterable) else [config_eos]
    return {int(i) for i in found if i is not None}


class _NoText:
    """Stands in for a tokenizer when none is given: every token's text is ''."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def decode(self, ids: list[int], **_kwargs: Any) -> str:
        return ""


def _collect(events: Iterator[Event], tokenizer: Tokenizer | None) -> Generation:
    tokens: list[Token] = []
    for event in events:
        if isinstance(event, Token):
            tokens.append(event)
        elif isinstance(event, ReplyDone):
            text = event.text if tokenizer is not None else None
            return Generation(list(event.ids), text, tokens, event.stats, event.stop_reason)
    raise RuntimeError("the engine ended without a ReplyDone event")
