"""Config files and `section.key=value` overrides: typed values, and one-line errors naming the key."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from specchat.config import (
    AUTO,
    CONFIG_DIR,
    RANDOM,
    Config,
    ConfigError,
    ModelConfig,
    from_wire,
    show_value,
    to_wire,
)
from specchat.settings import apply_overrides, as_flat_dict, get_value, load_config, problem, tomllib

REQUIRED_SECTIONS = {"target", "drafter", "sampling", "speculation"}
BUNDLED_CONFIGS = sorted(CONFIG_DIR.glob("*.toml"))


def test_default_config_is_the_bundled_pair():
    cfg = load_config()
    assert cfg.target.source == "bundled:qwen2.5-coder-1.5b-instruct"
    assert cfg.drafter.source == "bundled:qwen2.5-coder-0.5b-instruct"
    assert (cfg.target.dtype, cfg.target.quantization, cfg.target.device) == ("auto", "auto", "auto")  # w4a8 here
    assert (cfg.drafter.quantization, cfg.target.backend, cfg.drafter.backend) == ("auto-fast", "lean", "lean")
    assert cfg.runtime.kernel == "auto"
    assert cfg.speculation.mode == "spec" and cfg.speculation.gamma == AUTO and cfg.speculation.drafter_vocab == 32768
    assert cfg.sampling.is_greedy


@pytest.mark.parametrize("path", BUNDLED_CONFIGS, ids=lambda p: p.name)
def test_every_bundled_config_loads_with_the_four_sections(path):
    raw = tomllib.loads(path.read_text())
    assert REQUIRED_SECTIONS <= set(raw)
    cfg = load_config(path)
    assert cfg.target.source and cfg.drafter.source
    assert load_config(path.name) == cfg  # a bare name finds the bundled file


def test_hub_pairs_for_gpus_are_bundled():
    by_target = {load_config(p).target.source: load_config(p) for p in BUNDLED_CONFIGS}
    pairs = {
        "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.2-1B-Instruct",
        "google/gemma-7b-it": "google/gemma-2b-it",
        "meta-llama/Llama-2-13b-hf": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        "bigscience/bloomz-7b1": "bigscience/bloom-560m",
        "openai-community/gpt2-xl": "openai-community/gpt2",
    }
    for target, drafter in pairs.items():
        assert by_target[target].drafter.source == drafter
    assert by_target["Qwen/Qwen2.5-7B-Instruct"].target.quantization == "4bit"
    assert by_target["meta-llama/Llama-3.1-8B-Instruct"].target.quantization == "4bit"
    assert by_target["meta-llama/Llama-2-13b-hf"].target.device_map == "auto"


def test_overrides_are_typed_from_the_current_value():
    cfg = apply_overrides(
        load_config(),
        [
            "sampling.temperature=0.7",
            "sampling.top_k=40",
            "sampling.greedy=on",
            "sampling.seed=random",
            "speculation.gamma=auto",
            "speculation.extra_eos=<|im_end|>, ###",
            "target.dtype=float32",
            "drafter.quantization=4bit",
            "target.device=cuda:1",
            "ui.color=false",
            "target.source=./m.gguf",
        ],
    )
    assert cfg.sampling.temperature == 0.7 and cfg.sampling.top_k == 40 and cfg.sampling.greedy
    assert cfg.sampling.seed == RANDOM and cfg.speculation.gamma == AUTO
    assert cfg.speculation.extra_eos == ("<|im_end|>", "###")
    assert (cfg.target.dtype, cfg.drafter.quantization, cfg.target.device) == ("float32", "4bit", "cuda:1")
    assert cfg.ui.color is False and cfg.target.source == "./m.gguf"


def test_overrides_leave_the_original_untouched():
    base = load_config()
    changed = apply_overrides(base, ["speculation.gamma=7"])
    assert base.speculation.gamma == AUTO and changed.speculation.gamma == 7


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "sampling.temprature=0.5",
            r"unknown key 'sampling.temprature' \(did you mean 'temperature'\?\); sampling keys are temperature, top_k",
        ),
        (
            "sampler.temperature=0.5",
            r"unknown section 'sampler' \(did you mean 'sampling'\?\); sections are target, drafter",
        ),
        ("target.dtype=int4", "target.dtype must be one of auto, float32, bfloat16, float16, got 'int4'"),
        (
            "drafter.quantization=2bit",
            "drafter.quantization must be one of none, 4bit, 8bit, int8, w8a8, w8a8-fast, w4a8, w4a8-fast, auto, auto-fast, got '2bit'",
        ),
        ("target.device=gpu", "target.device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
        ("target.device_map=balanced", "target.device_map must be one of , auto"),
        ("speculation.gamma=99", "speculation.gamma must be an integer from 0 to 16, or auto, got 99"),
        ("speculation.gamma=four", "speculation.gamma must be an integer from 0 to 16 or auto, got 'four'"),
        ("speculation.mode=fast", "speculation.mode must be one of spec, target, drafter, got 'fast'"),
        ("sampling.top_p=0", r"sampling.top_p must be a number in \(0, 1\], got 0.0"),
        ("sampling.temperature=hot", "sampling.temperature must be a number, got 'hot'"),
        ("ui.color=maybe", r"ui.color must be on/off \(true/false\), got 'maybe'"),
        ("target.max_memory=20GiB", "target.max_memory can only be set in a config file"),
        ("temperature=0.5", "'temperature' is not a key: write section.key"),
        ("sampling.temperature", "override 'sampling.temperature' must look like section.key=value"),
    ],
)
def test_bad_overrides_are_one_line_errors_naming_key_and_allowed(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        apply_overrides(Config(), [override])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "toml, message",
    [
        (
            "[target]\nsorce = 'x'\n",
            r"unknown key 'target.sorce' \(did you mean 'source'\?\); target keys are source, dtype",
        ),
        ("[target]\ndtype = 16\n", "target.dtype must be a string, got 16"),
        ("[target]\ntrust_remote_code = 'yes'\n", r"target.trust_remote_code must be on/off \(true/false\), got 'yes'"),
        ("[speculation]\nextra_eos = '###'\n", "speculation.extra_eos must be a list of strings, got '###'"),
        ("[speculation]\nextra_eos = [1, 2]\n", "speculation.extra_eos must be a list of strings, got \\[1, 2\\]"),
        ("[sampling]\ntop_k = 1.5\n", "sampling.top_k must be an integer, got 1.5"),
        ("[sampling]\ngreedy = 1\n", r"sampling.greedy must be on/off \(true/false\), got 1"),
        ("[speculation]\ngamma = -3\n", "speculation.gamma must be an integer from 0 to 16, or auto, got -3"),
        ("gamma = 4\n", "'gamma' must be a \\[section\\] table"),
        ("[target\n", "not valid TOML"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert "\n" not in str(err.value)


def test_toml_values_widen_and_tables_load(tmp_path):
    path = tmp_path / "pair.toml"
    path.write_text(
        '[target]\nsource = "a"\ndevice_map = "auto"\nmax_memory = { 0 = "20GiB", 1 = "22GiB" }\n'
        '[sampling]\ntemperature = 1\n[speculation]\ngamma = "auto"\nextra_eos = ["###"]\n'
    )
    cfg = load_config(path, ["sampling.top_p=0.9"])
    assert cfg.target.max_memory == {"0": "20GiB", "1": "22GiB"}
    assert cfg.sampling.temperature == 1.0 and isinstance(cfg.sampling.temperature, float)
    assert cfg.speculation.gamma == AUTO and cfg.speculation.extra_eos == ("###",)
    assert cfg.sampling.top_p == 0.9


def test_missing_config_file_lists_the_bundled_ones(tmp_path):
    with pytest.raises(ConfigError, match="not found; bundled configs: .*default.toml"):
        load_config(tmp_path / "nope.toml")


def _config_folder(tmp_path):
    return tmp_path


def _config_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("[target]\nsource = 'caf\xe9'\n".encode("latin-1"))
    return path


def _config_nested_too_deep(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("[sampling]\nx = " + "[" * 100_000 + "\n")
    return path


def _config_a_fifo(tmp_path):
    path = tmp_path / "fifo.toml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (_config_folder, "is a directory; give a .toml file"),
        (_config_not_utf8, r"is not UTF-8 text \(byte 22 is 0xe9\)"),
        (_config_nested_too_deep, "not valid TOML \\(arrays or tables nested too deep\\)"),
        (_config_a_fifo, "is not a regular file"),
    ],
    ids=["directory", "not-utf8", "nested-too-deep", "fifo"],
)
def test_unreadable_config_files_are_one_line_naming_the_path(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_config_file_without_read_permission_is_one_line(tmp_path, monkeypatch):
    """Tests run as root, where chmod 000 does not stop a read: the refusal is simulated at the read."""
    path = tmp_path / "private.toml"
    path.write_text("[target]\n")

    opened = Path.open

    def refused(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refused)  # read_text and read_bytes open through it
    with pytest.raises(ConfigError, match=f"cannot read config file {path}: Permission denied$"):
        load_config(path)


def test_config_name_too_long_is_one_line():
    with pytest.raises(ConfigError, match="cannot read config file .*: File name too long"):
        load_config("/tmp/" + "a" * 300 + ".toml")


def test_flat_dict_names_every_key():
    flat = as_flat_dict(Config())
    fields = {
        f"{s.name}.{k.name}"
        for s in dataclasses.fields(Config)
        for k in dataclasses.fields(s.type if not isinstance(s.type, str) else ModelConfig)
    }
    assert "target.source" in flat and "speculation.gamma" in flat and "ui.context_limit" in flat
    assert {k for k in flat if k.startswith("target.")} == {k for k in fields if k.startswith("target.")}


@pytest.mark.parametrize("key, word, value", [("speculation.gamma", "auto", AUTO), ("sampling.seed", "random", RANDOM)])
def test_a_word_setting_has_one_parse_and_one_show_for_every_form(tmp_path, key, word, value):
    """gamma's auto and the seed's random: the word (any case) and the serialised -1, from `key=value` and
    TOML, are the typed value; it shows as the word and serialises as -1; numbers stay numbers."""
    section, name = key.split(".")
    for text in (word, word.upper(), "-1"):
        assert get_value(apply_overrides(Config(), [f"{key}={text}"]), key) == value
    for toml in (f'"{word}"', "-1"):
        (tmp_path / "c.toml").write_text(f"[{section}]\n{name} = {toml}\n")
        assert get_value(load_config(tmp_path / "c.toml"), key) == value
    assert show_value(key, value) == word and to_wire(key, value) == -1 and from_wire(key, -1) == value
    assert get_value(apply_overrides(Config(), [f"{key}=3"]), key) == 3 and show_value(key, 3) == "3"
    assert problem(key, -1) is not None and problem(key, value) is None  # the typed value, never the number
