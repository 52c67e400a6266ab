"""Settings: reading and checking them. TOML files, `section.key=value` overrides and typed values from commands
and the API, each validated against what the setting allows (VALIDATORS); every bad key or value raises
ConfigError with one line naming the key and what is allowed. The schema is config.py's.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any

from specchat.config import (
    BACKENDS,
    COMPARE,
    CONFIG_DIR,
    DEFAULT_CONFIG,
    DTYPES,
    GAMMA_MAX,
    KERNELS,
    KV_CACHES,
    MODES,
    QUANTIZATIONS,
    VIEWS,
    WORD_SETTINGS,
    Auto,
    Config,
    ConfigError,
    Random,
    from_wire,
    plain_int,
    undecodable_at,
)
from specchat.speculative.drafters import registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_STOPS, STOP_CHARS = 8, 200  # stop texts a chat may have, and their length
Validator = Callable[[Any], str | None]  # a value -> what it must be, or None where it fits


def _one_of(allowed: tuple[str, ...]) -> Validator:
    return lambda v: None if v in allowed else f"one of {', '.join(allowed)}"


def _int_range(lo: int, hi: int) -> Validator:
    return lambda v: None if lo <= v <= hi else f"an integer from {lo} to {hi}"


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
        if isinstance(v, Random) or plain_int(v) and 0 <= v <= 2**63 - 1
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
        if isinstance(v, Auto) or plain_int(v) and 0 <= v <= GAMMA_MAX
        else f"an integer from 0 to {GAMMA_MAX}, or auto"
    ),
    ("speculation", "mode"): _one_of(MODES),
    ("speculation", "compare"): _one_of(COMPARE),
    ("speculation", "drafter"): registry.problem,
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


def problem(key: str, value: Any) -> str | None:
    """What `section.key` must be, where `value` does not fit (its validator's words); None where it does."""
    section, name = _split_key(key)
    check = _validator(section, name)
    return check(value) if check else None


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
        if isinstance(value, (Auto, Random)) or plain_int(value):
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
