"""Settings: the schema. Frozen dataclasses with their defaults, the allowed words, and the wire forms of the
settings that take a number or a word. Reading them from TOML, `section.key=value` and commands, and validating
them, is settings.py's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Union

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "4bit", "8bit", "int8", "w8a8", "w8a8-fast", "w4a8", "w4a8-fast", "auto", "auto-fast")
W8A8_MODES = ("w8a8", "w8a8-fast")  # int8×int8 on fbgemm: 16-bit activations into the MLP and head, or 8-bit everywhere
# specchat's batch-invariant CPU kernels: float32 out, so norms and attention stay in float32
# w4a8: 4-bit weights (a GGUF's own Q4_K blocks where it has them; its finer layers 6-bit) × 8-bit
# activations on specchat's own CPU kernel (quant/w4a8.py); w4a8-fast: every layer 4-bit
W4A8_MODES = ("w4a8", "w4a8-fast")
# auto (auto-fast): w4a8 (w4a8-fast) on a CPU where specchat's kernel builds, else w8a8 (w8a8-fast) on
# x86, else none, with one notice line; unquantized off the CPU (loading/quantization_choice.py)
AUTO_MODES = {"auto": ("w4a8", "w8a8"), "auto-fast": ("w4a8-fast", "w8a8-fast")}
KERNELS = ("auto", "portable", "avx2", "avx-vnni", "avx512-vnni", "amx")  # the w4a8 kernel's code paths
KV_CACHES = ("float16", "bfloat16", "float32")  # how the compiled layer loop stores keys and values
INVARIANT_MODES = (*W8A8_MODES, *W4A8_MODES)
BACKENDS = ("lean", "transformers")  # lean: specchat's forward for Llama/Qwen2; others use transformers


class Mode(str, Enum):
    """Who answers: the pair speculatively (SPEC), the target alone (TARGET), or the drafter alone (DRAFTER).
    Settings hold it as its value's text ("spec"), and say it so."""

    SPEC = "spec"
    TARGET = "target"
    DRAFTER = "drafter"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:  # as settings are shown (/set, /config): the text a user types
        return repr(self.value)


MODES = tuple(mode.value for mode in Mode)
VIEWS = ("origin", "markdown")  # how a finished reply is shown: as it streamed, or also as Markdown
COMPARE = ("off", "on", "drafter")


class ConfigError(ValueError):
    """A bad config file, key or value; the message is one line for the user."""


@dataclass(frozen=True)
class Auto:
    """gamma "auto": the gamma policy plans each step's draft from the measured alpha and c (speculative/gamma.py)."""

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class Random:
    """seed "random": each reply draws a fresh seed (and reports it in ReplyEnd.seed)."""

    def __str__(self) -> str:
        return "random"


AUTO = Auto()
RANDOM = Random()
Gamma = Union[int, Auto]  # noqa: UP007 (an alias evaluated at import: | needs Python 3.10's types)
Seed = Union[int, Random]  # noqa: UP007


@dataclass(frozen=True)
class ModelConfig:
    source: str = ""  # hub id, local dir, .gguf file, or bundled:<name>
    dtype: str = "auto"
    quantization: str = "none"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    device_map: str = ""  # "" (one device) or "auto" (spread over GPUs via accelerate)
    max_memory: dict[str, Any] = field(default_factory=dict)  # e.g. {0 = "20GiB", 1 = "20GiB"}: sizes or bytes
    trust_remote_code: bool = False
    revision: str = ""
    backend: str = "lean"  # lean | transformers (the lean forward falls back to it by itself)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off; else keep tokens at least min_p times as likely as the most likely one
    repeat_penalty: float = 1.0  # 1 = off; llama.cpp's: a logit of the last 64 ids divided if > 0, else multiplied
    presence_penalty: float = 0.0  # 0 = off; subtracted from the logit of every id of the last 64
    greedy: bool = False  # greedy regardless of temperature
    seed: Seed = 0  # RANDOM = a fresh random seed each reply
    max_new_tokens: int = 0  # 0 = no cap: a reply runs to its end of turn or the context window
    repetition_stop: int = 64  # end a reply whose newest tokens repeat one span over this many (session/repetition.py)
    stop: tuple[str, ...] = ()  # a chat reply ends before the first of these texts it writes (session/stop_strings.py)

    @property
    def capped(self) -> bool:
        return self.max_new_tokens > 0

    @property
    def penalized(self) -> bool:
        """Whether the target's logits are penalized for the ids just seen (repeat or presence penalty)."""
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0


@dataclass(frozen=True)
class SpeculationConfig:
    gamma: Gamma = 4  # drafted tokens per step; 0 = target-only; AUTO = the policy plans each step
    mode: Mode = Mode.SPEC  # spec | target | drafter (settings give the text; __post_init__ makes it a Mode)
    compare: str = "off"  # off | on | drafter
    extra_eos: tuple[str, ...] = ()  # extra stop strings (each must be a single token)
    drafter_vocab: int = 0  # drafter proposes only ids below this (0 = its whole vocabulary); still exact
    draft_confidence: float = 0.0  # end a draft after a token the drafter gives less probability (0 = off)
    prompt_lookup: bool = False  # the drafter checks prompt-lookup guesses in the same forward (lookup.py)
    drafter_context: int = 0  # the drafter model keeps a longer conversation's first N/4 and last 3N/4 tokens (0 = all)
    drafter: str = "model"  # a kind's name from speculative/drafters/registry.py: model | lookup | auto | self:N

    def __post_init__(self) -> None:
        if isinstance(self.mode, str) and self.mode in MODES:  # the text a setting gives; another is the validator's
            object.__setattr__(self, "mode", Mode(self.mode))


@dataclass(frozen=True)
class UIConfig:
    color: bool = True
    show_rejected: bool = False
    origin_marks: bool = True  # with colour off, each token's origin is bracketed in the stream (tui/render.py MARKS)
    view: str = "origin"  # origin: each reply as it streamed; markdown: also drawn as Markdown once done (/view)
    system_prompt: str = "You are a helpful assistant."
    context_limit: int = 0  # 0 = the target's own maximum


@dataclass(frozen=True)
class RuntimeConfig:
    kernel: str = "auto"  # the w4a8 kernel's code path: auto (the fastest this CPU has) or one of KERNELS
    kv_cache: str = "float16"  # keys and values of models on the compiled layer loop: float16, bfloat16 or float32
    memory_check: bool = True  # refuse, before loading, a pair that will not fit in memory (loading/memory_need.py)


@dataclass(frozen=True)
class Config:
    target: ModelConfig = ModelConfig()
    drafter: ModelConfig = ModelConfig()
    sampling: SamplingConfig = SamplingConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    ui: UIConfig = UIConfig()
    runtime: RuntimeConfig = RuntimeConfig()


GAMMA_MAX = 16


def undecodable_at(text: str) -> int | None:
    """Index of the first lone surrogate in `text`, else None. A terminal's bytes that are not UTF-8 arrive
    so (prompt_toolkit and argv decode with surrogateescape); no tokenizer or UTF-8 output takes them."""
    return next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)


@dataclass(frozen=True)
class WordSetting:
    """A number setting that also takes one word: its one parse and one show, for every place that reads or
    writes it (TOML, `key=value`, slash commands, the API, /config, the toolbar, stats lines, the bench).

    `wire` is the serialised form: what transcripts (/save PATH.json) and `--json` stats write for the word,
    as they did before the word had a type of its own; parse reads it back, so old files still /load."""

    word: str
    value: Any  # AUTO or RANDOM
    wire: int
    numbers: str  # what the number may be, for messages

    def parse(self, raw: Any) -> Any:
        """The setting from user text, a TOML or JSON value, or an API argument; anything else is returned
        as it came, for the validator to judge."""
        if isinstance(raw, str) and raw.strip().lower() == self.word:
            return self.value
        if plain_int(raw) and raw == self.wire:
            return self.value
        return raw

    def show(self, value: Any) -> str:
        return self.word if value == self.value else str(value)

    def dump(self, value: Any) -> Any:
        """The serialised form: `wire` for the word, the number as it is."""
        return self.wire if value == self.value else value


WORD_SETTINGS = {  # beside VALIDATORS: the settings whose value is a number or a word
    "speculation.gamma": WordSetting("auto", AUTO, -1, f"an integer from 0 to {GAMMA_MAX}"),
    "sampling.seed": WordSetting("random", RANDOM, -1, "an integer"),
}


def plain_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def from_wire(key: str, value: Any) -> Any:
    """A value as a transcript or TOML file holds it, as the setting's type (a word setting's word or wire)."""
    word = WORD_SETTINGS.get(key)
    return word.parse(value) if word else value


def to_wire(key: str, value: Any) -> Any:
    """A setting as transcripts and `--json` write it (a word setting's word as its wire number)."""
    word = WORD_SETTINGS.get(key)
    return word.dump(value) if word else value


def show_value(key: str, value: Any) -> str:
    """A setting as the UI says it: a word setting's word, else the value's text."""
    word = WORD_SETTINGS.get(key)
    return word.show(value) if word else str(value)


def seed_for_reply(seed: Seed) -> int:
    """The seed one reply samples with: the setting's number, or a fresh one where it is RANDOM."""
    return random.randrange(2**63) if isinstance(seed, Random) else seed
