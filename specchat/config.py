"""Settings: frozen dataclasses, TOML loading, `section.key=value` overrides, validation.

Every bad key or value raises ConfigError with one line naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Union

from specchat import drafter_kinds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

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
    drafter: str = "model"  # a kind's name from drafter_kinds.py: model | lookup | auto | self:N

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


@dataclass(frozen=True)
class Config:
    target: ModelConfig = ModelConfig()
    drafter: ModelConfig = ModelConfig()
    sampling: SamplingConfig = SamplingConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    ui: UIConfig = UIConfig()
    runtime: RuntimeConfig = RuntimeConfig()


GAMMA_MAX = 16


def drafter_needed(has_drafter: bool, mode: Mode | str, compare: str = "off", drafter: str = "model") -> str | None:
    """Why a speculation mode (and compare setting, and drafter kind) cannot run without a drafter model;
    None when it can. Prompt lookup drafts with no model, but only in spec mode.

    The one place that decides it: loading, the CLI, the session, the commands and the engine ask here."""
    if has_drafter:
        return None
    if mode == Mode.DRAFTER or (mode == Mode.SPEC and drafter_kinds.needs_model(drafter)):
        return f"mode '{mode}' needs a drafter model"
    if compare == "drafter":
        return "compare 'drafter' needs a drafter model"
    return None


Validator = Callable[[Any], str | None]  # a value -> what it must be, or None where it fits


def _one_of(allowed: tuple[str, ...]) -> Validator:
    return lambda v: None if v in allowed else f"one of {', '.join(allowed)}"


def _int_range(lo: int, hi: int) -> Validator:
    return lambda v: None if lo <= v <= hi else f"an integer from {lo} to {hi}"


def undecodable_at(text: str) -> int | None:
    """Index of the first lone surrogate in `text`, else None. A terminal's bytes that are not UTF-8 arrive
    so (prompt_toolkit and argv decode with surrogateescape); no tokenizer or UTF-8 output takes them."""
    return next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)


MAX_STOPS, STOP_CHARS = 8, 200  # stop texts a chat may have, and their length
SYSTEM_PROMPT_CHARS = 1_000_000  # a system prompt longer than this fits no context window the chat can run


def _check_text(v: str) -> str | None:
    if len(v) > SYSTEM_PROMPT_CHARS:
        return f"at most {SYSTEM_PROMPT_CHARS:,} characters (this holds {len(v):,})"
    return None if undecodable_at(v) is None else "UTF-8 text (this holds a byte the terminal could not decode)"


def _check_device(v: str) -> str | None:
    ok = v in ("auto", "cpu", "cuda", "mps") or (v.startswith("cuda:") and v[5:].isdigit())
    return None if ok else "auto, cpu, cuda, cuda:N or mps"


VALIDATORS: dict[tuple[str, str], Validator] = {
    ("model", "dtype"): _one_of(DTYPES),
    ("model", "quantization"): _one_of(QUANTIZATIONS),
    ("model", "backend"): _one_of(BACKENDS),
    ("model", "device"): _check_device,
    ("model", "device_map"): _one_of(("", "auto")),
    ("sampling", "temperature"): lambda v: None if 0.0 <= v <= 5.0 else "a number from 0 to 5 (0 = greedy)",
    ("sampling", "top_k"): _int_range(0, 1_000_000),
    ("sampling", "top_p"): lambda v: None if 0.0 < v <= 1.0 else "a number in (0, 1]",
    ("sampling", "min_p"): lambda v: None if 0.0 <= v < 1.0 else "a number in [0, 1) (0 = off)",
    ("sampling", "repeat_penalty"): lambda v: None if 0.0 < v <= 10.0 else "a number in (0, 10] (1 = off)",
    ("sampling", "presence_penalty"): lambda v: None if -10.0 <= v <= 10.0 else "a number in [-10, 10] (0 = off)",
    ("sampling", "seed"): lambda v: (
        None
        if isinstance(v, Random) or _plain_int(v) and 0 <= v <= 2**63 - 1
        else f"an integer from 0 to {2**63 - 1}, or random"
    ),
    ("sampling", "repetition_stop"): lambda v: (
        None if v == 0 or 16 <= v <= 1_000_000 else "0 (off) or a number of tokens of at least 16"
    ),
    ("sampling", "stop"): lambda v: (
        None
        if len(v) <= MAX_STOPS and all(0 < len(text) <= STOP_CHARS for text in v)
        else f"at most {MAX_STOPS} texts of 1 to {STOP_CHARS} characters each"
    ),
    ("sampling", "max_new_tokens"): lambda v: (
        None
        if 0 <= v <= 1_000_000
        else "0 (no cap: to the end of the turn or the context window) or a number of tokens up to 1000000"
    ),
    ("speculation", "gamma"): lambda v: (
        None
        if isinstance(v, Auto) or _plain_int(v) and 0 <= v <= GAMMA_MAX
        else f"an integer from 0 to {GAMMA_MAX}, or auto"
    ),
    ("speculation", "mode"): _one_of(MODES),
    ("speculation", "compare"): _one_of(COMPARE),
    ("speculation", "drafter"): drafter_kinds.problem,
    ("speculation", "draft_confidence"): lambda v: None if 0.0 <= v < 1.0 else "a probability in [0, 1) (0 = off)",
    ("speculation", "drafter_vocab"): lambda v: (
        None if v == 0 or 256 <= v <= 10_000_000 else "0 (the whole vocabulary) or an id limit of at least 256"
    ),
    ("speculation", "drafter_context"): lambda v: (
        None if v == 0 or 256 <= v <= 10_000_000 else "0 (the whole conversation) or a number of tokens of at least 256"
    ),
    ("ui", "context_limit"): _int_range(0, 10_000_000),
    ("ui", "view"): _one_of(VIEWS),
    ("ui", "system_prompt"): _check_text,
    ("runtime", "kernel"): _one_of(KERNELS),
    ("runtime", "kv_cache"): _one_of(KV_CACHES),
}


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
        if _plain_int(raw) and raw == self.wire:
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


def _plain_int(v: Any) -> bool:
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


def problem(key: str, value: Any) -> str | None:
    """What `section.key` must be, where `value` does not fit (its validator's words); None where it does."""
    section, name = _split_key(key)
    check = _validator(section, name)
    return check(value) if check else None


def seed_for_reply(seed: Seed) -> int:
    """The seed one reply samples with: the setting's number, or a fresh one where it is RANDOM."""
    return random.randrange(2**63) if isinstance(seed, Random) else seed


def _validator(section: str, key: str) -> Validator | None:
    kind = "model" if section in ("target", "drafter") else section
    return VALIDATORS.get((kind, key))


def _section_fields(cfg: Config, section: str) -> dict[str, dataclasses.Field[Any]]:
    if section not in {f.name for f in dataclasses.fields(Config)}:
        raise ConfigError(
            f"unknown section '{section}'{_suggest(section, sections())}; sections are {', '.join(sections())}"
        )
    return {f.name: f for f in dataclasses.fields(getattr(cfg, section))}


def sections() -> list[str]:
    return [f.name for f in dataclasses.fields(Config)]


def all_keys() -> list[str]:
    """Every `section.key` a user may set."""
    cfg = Config()
    return [f"{s}.{k}" for s in sections() for k in _section_fields(cfg, s)]


def _suggest(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_value(text: str, current: Any, key: str) -> Any:
    """Turn the text a user typed into the type of the current value."""
    text = text.strip()
    word = WORD_SETTINGS.get(key)
    if word is not None and text.lower() == word.word:
        return word.value
    if key == "sampling.max_new_tokens" and text.lower() in ("off", "none"):
        return 0
    try:
        if isinstance(current, bool):
            return _parse_bool(text)
        if word is not None:
            return word.parse(int(text))
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            return float(text)
        if isinstance(current, tuple):
            return tuple(s for s in (p.strip() for p in text.split(",")) if s)
        if isinstance(current, dict):
            raise ConfigError(f"{key} can only be set in a config file (a TOML table)")
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        kind = _WORDS_FOR_KEY.get(key) or _KIND_WORDS.get(type(current).__name__, type(current).__name__)
        raise ConfigError(f"{key} must be {kind}, got {quoted(text)}") from None
    return text


_WORDS_FOR_KEY = {
    **{key: f"{w.numbers} or {w.word}" for key, w in WORD_SETTINGS.items()},
    "sampling.max_new_tokens": "an integer or off",
}  # keys that take a word besides their type
_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "on/off (true/false)",
    "str": "a string",
    "tuple": "a list of strings",
    "dict": "a table",
}


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _coerce_toml(value: Any, current: Any, key: str) -> Any:
    """TOML values already carry types; check they fit and widen int to float."""
    if key in WORD_SETTINGS:
        value = from_wire(key, value)
        if isinstance(value, (Auto, Random)) or _plain_int(value):
            return value
        raise ConfigError(f"{key} must be {_WORDS_FOR_KEY[key]}, got {quoted(value)}")
    if isinstance(current, bool) != isinstance(value, bool):
        want = _KIND_WORDS.get(type(current).__name__, type(current).__name__)
        raise ConfigError(f"{key} must be {want}, got {quoted(value)}")
    if isinstance(current, float) and isinstance(value, int):
        return float(value)
    if isinstance(current, tuple) and isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{key} must be {_KIND_WORDS['tuple']}, got {quoted(value)}")
        return tuple(value)
    if isinstance(current, Enum) and isinstance(value, str):
        return value  # a Mode's text: its validator judges it, and the settings make it a Mode
    if type(value) is not type(current):
        want = _KIND_WORDS.get(type(current).__name__, type(current).__name__)
        raise ConfigError(f"{key} must be {want}, got {quoted(value)}")
    return value


QUOTED_CHARS = 80  # of a refused value, quoted in its error line


def quoted(value: Any) -> str:
    """A refused value as its error line quotes it: repr, cut to QUOTED_CHARS (a value may be megabytes)."""
    text = repr(value)
    return text if len(text) <= QUOTED_CHARS else f"{text[: QUOTED_CHARS - 1]}… ({len(text):,} characters)"


def with_value(cfg: Config, key: str, value: Any) -> Config:
    """A copy of cfg with `section.key` set to an already-typed value, validated."""
    section, name = _split_key(key)
    fields = _section_fields(cfg, section)
    if name not in fields:
        raise ConfigError(f"unknown key '{key}'{_suggest(name, fields)}; {section} keys are {', '.join(fields)}")
    check = _validator(section, name)
    problem = check(value) if check else None
    if problem:
        raise ConfigError(f"{key} must be {problem}, got {quoted(value)}")
    new_section = dataclasses.replace(getattr(cfg, section), **{name: value})
    return dataclasses.replace(cfg, **{section: new_section})


def get_value(cfg: Config, key: str) -> Any:
    section, name = _split_key(key)
    fields = _section_fields(cfg, section)
    if name not in fields:
        raise ConfigError(f"unknown key '{key}'{_suggest(name, fields)}; {section} keys are {', '.join(fields)}")
    return getattr(getattr(cfg, section), name)


def set_from_text(cfg: Config, key: str, text: str) -> Config:
    """Apply one `section.key=value` as typed by a user."""
    return with_value(cfg, key, parse_value(text, get_value(cfg, key), key))


def _split_key(key: str) -> tuple[str, str]:
    if key.count(".") != 1:
        raise ConfigError(
            f"'{key}' is not a key: write section.key, e.g. sampling.temperature (sections: {', '.join(sections())})"
        )
    section, name = key.split(".")
    return section, name


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, text = item.split("=", 1)
        cfg = set_from_text(cfg, key.strip(), text)
    return cfg


def from_mapping(data: dict[str, Any], base: Config | None = None) -> Config:
    cfg = base or Config()
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"'{section}' must be a [section] table; sections are {', '.join(sections())}")
        _section_fields(cfg, section)
        for name, value in table.items():
            key = f"{section}.{name}"
            cfg = with_value(cfg, key, _coerce_toml(value, get_value(cfg, key), key))
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML file (default: the bundled pair) and apply `section.key=value` overrides."""
    path = Path(path) if path else DEFAULT_CONFIG
    try:
        if not path.exists() and not path.is_absolute() and (CONFIG_DIR / path.name).exists():
            path = CONFIG_DIR / path.name
        found = path.exists()
    except OSError as err:  # a name too long, a folder on the way that cannot be searched
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    if not found:
        raise ConfigError(
            f"config file {path} not found; bundled configs: "
            f"{', '.join(p.name for p in sorted(CONFIG_DIR.glob('*.toml')))}"
        )
    return apply_overrides(from_mapping(_read_toml(path)), overrides or [])


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML table of a config file; every reason it cannot be read is one ConfigError line naming the path."""
    try:
        if not path.is_file():  # a folder, or a FIFO or device that a read would wait on
            raise ConfigError(
                f"config file {path} is {'a directory' if path.is_dir() else 'not a regular file'}; give a .toml file"
            )
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {err.start} is "
            f"0x{err.object[err.start]:02x}); TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML (arrays or tables nested too deep)") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None


def as_flat_dict(cfg: Config) -> dict[str, Any]:
    """`section.key` -> value, in declaration order, for /config and transcripts."""
    return {key: get_value(cfg, key) for key in all_keys()}
