"""Model loading: every offline source kind, the converted-GGUF cache, bitsandbytes on the CPU,
placement arguments, pair checks and one-line errors. One slow test loads the real bundled pair."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
import torch
from conftest import assert_greedy_spec_is_target_only
from model_files import PROMPT, greedy_reply, logits, save_dir, tiny_qwen2, write_gguf
from tiny_models import CHATML, build_model, build_tokenizer

from specchat import cache_folder
from specchat.config import Config, ModelConfig, SamplingConfig, SpeculationConfig, UIConfig
from specchat.loading import assets, devices, pair_check, shared_tokenizer
from specchat.loading import models as model_loading
from specchat.loading import plan as planning
from specchat.loading.gguf import convert as gguf_convert
from specchat.loading.models import ModelFacts, ModelLoadError, load_model, load_pair
from specchat.loading.shared_tokenizer import tokenizer_digest
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.engine import Engine
from specchat.speculative.sampling import TORCH_SAMPLER


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    """These tests mean the CPU (they feed CPU ids, expect CPU kernels): device "auto" resolves to it even where
    torch sees a GPU. tests/gpu/ runs a pair on CUDA."""
    resolve = devices.resolve_device
    monkeypatch.setattr(planning, "resolve_device", lambda device: "cpu" if device == "auto" else resolve(device))


# ----- tiny checkpoints on disk -----------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tok):
    model = build_model(len(tok), seed=1, layers=2)
    return save_dir(tmp_path_factory.mktemp("target"), model, tok), model


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tok):
    model = build_model(len(tok), seed=2, layers=1, hidden=32)
    return save_dir(tmp_path_factory.mktemp("drafter"), model, tok), model


def local_cfg(target: str, drafter: str = "", **model_keys) -> Config:
    return Config(
        target=ModelConfig(source=target, dtype="float32", **model_keys),
        drafter=ModelConfig(source=drafter, dtype="float32"),
        speculation=SpeculationConfig(mode="spec" if drafter else "target"),
    )


# ----- local directories -------------------------------------------------------------------------
def test_local_directory_loads_the_same_weights_with_facts(target_dir, tok):
    path, original = target_dir
    model, tokenizer, facts = load_model(ModelConfig(source=str(path), dtype="float32"))
    assert torch.equal(logits(model, tokenizer), logits(original, tok))
    assert not model.training
    assert tokenizer.chat_template == CHATML
    assert facts.name == path.name and facts.source == str(path)
    assert facts.params == sum(p.numel() for p in original.parameters())
    assert (facts.dtype, facts.quantization, facts.device, facts.template) == ("float32", "none", "cpu", "own")
    assert facts.memory_bytes == original.get_memory_footprint() and facts.load_s >= 0


def test_load_pair_from_local_directories(target_dir, drafter_dir, tok):
    pair = load_pair(local_cfg(str(target_dir[0]), str(drafter_dir[0])))
    assert isinstance(pair.target_facts, ModelFacts) and pair.drafter_facts.name == drafter_dir[0].name
    ends = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert pair.eos_ids == ends
    assert pair.vocab_size == len(tok) == 384
    assert pair.context_limit == 1024  # the target's max_position_embeddings
    ids = tok.encode(PROMPT)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


def test_a_pair_with_the_same_tokenizer_files_reads_them_once(target_dir, drafter_dir, monkeypatch):
    reads = []
    real = shared_tokenizer.load_tokenizer
    monkeypatch.setattr(shared_tokenizer, "load_tokenizer", lambda *args: reads.append(args[0].location) or real(*args))
    load_pair(local_cfg(str(target_dir[0]), str(drafter_dir[0])))
    assert reads == [str(target_dir[0])]  # the drafter's files are the target's, byte for byte
    reads.clear()
    load_model(ModelConfig(source=str(target_dir[0]), dtype="float32"))
    load_model(ModelConfig(source=str(drafter_dir[0]), dtype="float32"))
    assert len(reads) == 2  # outside one pair, nothing is shared


def test_a_drafter_whose_files_differ_only_in_its_chat_template_shares_the_vocabulary(tmp_path, tok, monkeypatch):
    """The bundled pair's case: one read of the tokenizer files, the drafter's a copy sharing the target's backend
    (its ids are the target's, nothing compared) with its own template; the banner says the templates differ."""
    import shutil

    model = build_model(len(tok), seed=2, layers=1, hidden=32)
    target = save_dir(tmp_path / "target", build_model(len(tok), seed=1, layers=1, hidden=32), tok)
    drafter = save_dir(tmp_path / "drafter", model, tok)
    shutil.copy(target / "tokenizer.json", drafter / "tokenizer.json")
    templates = {folder: shared_tokenizer.chat_template_of(folder) for folder in (target, drafter)}
    assert isinstance(templates[target], str) and templates[target] == templates[drafter]
    (drafter / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for name in ("tokenizer_config.json", "chat_template.json"):  # wherever this transformers keeps it, drop it
        path = drafter / name
        if path.exists():
            fields = json.loads(path.read_text())
            fields.pop("chat_template", None)
            path.write_text(json.dumps(fields))
    reads, copies, compared = [], [], []
    real, copy_with = shared_tokenizer.load_tokenizer, shared_tokenizer.with_template
    monkeypatch.setattr(shared_tokenizer, "load_tokenizer", lambda *args: reads.append(args[0].location) or real(*args))
    monkeypatch.setattr(shared_tokenizer, "with_template", lambda *args: copies.append(copy_with(*args)) or copies[-1])
    monkeypatch.setattr(pair_check, "first_difference", lambda *args: compared.append(args) or "")
    pair = load_pair(local_cfg(str(target), str(drafter)))
    assert reads == [str(target)] and len(copies) == 1 and compared == []
    drafter_tok, kind = copies[0]
    assert kind == "own" and drafter_tok is not pair.tokenizer
    assert drafter_tok.backend_tokenizer is pair.tokenizer.backend_tokenizer
    assert drafter_tok.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert pair.tokenizer.chat_template == templates[target]
    assert pair.pair_check.kind == "same" and pair.pair_check.template is False
    ids = tok.encode(PROMPT)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


def test_the_tokenizer_digest_follows_the_tokenizer_files_and_model_type_only(tmp_path, tok):
    folder = save_dir(tmp_path / "m", build_model(len(tok), seed=3, layers=1, hidden=32), tok)
    before = tokenizer_digest(str(folder), trust_remote_code=False)
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert tokenizer_digest(str(folder), trust_remote_code=False) == before
    assert tokenizer_digest(str(folder), trust_remote_code=True) != before
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": config["model_type"] + "-other"}))
    assert tokenizer_digest(str(folder), trust_remote_code=False) != before
    (folder / "config.json").write_text(json.dumps(config))
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text.replace('"<|im_end|>"', '"<|im_stop|>"', 1))
    assert tokenizer_digest(str(folder), trust_remote_code=False) != before
    (folder / "tokenizer.json").write_text(text)
    (folder / "chat_template.jinja").write_text("{{ messages }}")  # a template is not the vocabulary
    assert tokenizer_digest(str(folder), trust_remote_code=False) == before
    assert tokenizer_digest("Qwen/Qwen2.5-0.5B", trust_remote_code=False) is None  # hub ids are not compared


def test_context_limit_override_and_extra_eos(target_dir, tok):
    cfg = replace(
        local_cfg(str(target_dir[0])),
        ui=UIConfig(context_limit=300),
        speculation=SpeculationConfig(mode="target", extra_eos=("def",)),
    )
    pair = load_pair(cfg)
    assert pair.context_limit == 300 and pair.drafter is None and pair.drafter_facts is None
    assert tok.convert_tokens_to_ids("def") in pair.eos_ids


@pytest.mark.parametrize("mode", ["spec", "target"])
def test_extra_eos_stops_a_reply(target_dir, drafter_dir, tok, mode):
    """A stop string configured as speculation.extra_eos ends the greedy reply at its token, which the
    reply without it writes later on (and, in spec mode, possibly inside a step's accepted drafts)."""
    ids = tok.encode(PROMPT)
    plain = greedy_reply(load_pair(local_cfg(str(target_dir[0]), str(drafter_dir[0]))), mode, ids)
    stop_at = next(
        i
        for i, t in enumerate(plain)
        if i >= 3 and t not in plain[:i] and tok.encode(tok.decode([t]), add_special_tokens=False) == [t]
    )
    text = tok.decode([plain[stop_at]])
    cfg = replace(
        local_cfg(str(target_dir[0]), str(drafter_dir[0])), speculation=SpeculationConfig(mode=mode, extra_eos=(text,))
    )
    pair = load_pair(cfg)
    assert plain[stop_at] in pair.eos_ids
    drafter = ModelDrafter(pair.drafter, pair.vocab_size)
    engine = Engine(pair.target, pair.tokenizer, drafter, eos_ids=pair.eos_ids, vocab_size=pair.vocab_size)
    done = list(
        engine.stream(ids, SamplingConfig(temperature=0.0, max_new_tokens=24), SpeculationConfig(gamma=4, mode=mode))
    )[-1]
    assert list(done.ids) == plain[: stop_at + 1] and done.stop_reason == "eos"
    assert done.text.endswith(text)


def test_multi_token_extra_eos_is_a_one_line_error(target_dir):
    cfg = replace(
        local_cfg(str(target_dir[0])), speculation=SpeculationConfig(mode="target", extra_eos=("reverse the list",))
    )
    with pytest.raises(ModelLoadError, match=r"extra_eos: 'reverse the list' is \d+ tokens"):
        load_pair(cfg)


def test_speculation_without_a_drafter_is_an_error(target_dir):
    cfg = replace(local_cfg(str(target_dir[0])), speculation=SpeculationConfig(mode="spec"))
    with pytest.raises(ModelLoadError, match="needs a drafter model, and drafter.source is empty: set drafter.source"):
        load_pair(cfg)


def test_tokenizer_without_chat_template_gets_the_plain_one(tmp_path, tok):
    bare = build_tokenizer()
    bare.chat_template = None
    path = save_dir(tmp_path / "base", build_model(len(tok), seed=3), bare)
    _, tokenizer, facts = load_model(ModelConfig(source=str(path), dtype="float32"))
    assert facts.template == "plain"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "User: hi\nAssistant:"


# ----- GGUF files and the converted-checkpoint cache ---------------------------------------------
@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, tok):
    model = tiny_qwen2(len(tok))
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-qwen.gguf", model, tok), model


def test_gguf_file_converts_once_and_loads_from_the_cache(gguf_file, tok, cache, monkeypatch):
    path, original = gguf_file
    model, tokenizer, facts = load_model(ModelConfig(source=str(path), dtype="float32"))
    assert torch.equal(logits(model, tokenizer), logits(original, tok))
    assert tokenizer.chat_template == CHATML and len(tokenizer) == len(tok)
    assert tokenizer.convert_ids_to_tokens(list(range(len(tok)))) == tok.convert_ids_to_tokens(list(range(len(tok))))
    assert (facts.name, facts.quantization, facts.dtype) == ("tiny-qwen", "ALL_F32", "float32")
    converted = list((cache / "converted").iterdir())
    assert [d.name.endswith("-float32") for d in converted] == [True]
    assert gguf_convert.read_meta(converted[0])["quantization"] == "ALL_F32"

    def no_conversion(*args):
        raise AssertionError("converted again although the cache holds the checkpoint")

    monkeypatch.setattr(gguf_convert, "convert_gguf", no_conversion)
    monkeypatch.setattr(cache_folder, "file_sha256", no_conversion)  # the digest is remembered too
    again, _, _ = load_model(ModelConfig(source=str(path), dtype="float32"))
    assert torch.equal(logits(again, tokenizer), logits(original, tok))


def test_gguf_cache_is_keyed_by_content_and_dtype(gguf_file, tok, cache, tmp_path):
    path, _ = gguf_file
    load_model(ModelConfig(source=str(path), dtype="float32"))
    load_model(ModelConfig(source=str(path), dtype="bfloat16"))
    other = write_gguf(tmp_path / "other.gguf", tiny_qwen2(len(tok), seed=6), tok)
    load_model(ModelConfig(source=str(other), dtype="float32"))
    names = sorted(d.name for d in (cache / "converted").iterdir())
    assert len(names) == 3 and sum(n.endswith("-bfloat16") for n in names) == 1


def test_a_base_gguf_chats_in_the_plain_template_and_drafts_exactly(tmp_path, tok, cache, gguf_file):
    """A GGUF with no chat template (a base model's) loads: as a target its tokenizer chats in the plain
    User:/Assistant: turns, said on the banner; as a drafter for an instruct target it drafts, and greedy
    speculative decoding stays the target's own output."""
    base = write_gguf(tmp_path / "base.gguf", tiny_qwen2(len(tok), seed=6), tok, chat_template=None)
    model, tokenizer, facts = load_model(ModelConfig(source=str(base), dtype="float32"))
    assert facts.template == "plain" and "Assistant:" in tokenizer.chat_template
    target, target_tok, target_facts = load_model(ModelConfig(source=str(gguf_file[0]), dtype="float32"))
    assert target_facts.template == "own"
    assert_greedy_spec_is_target_only(target, model, target_tok, PROMPT, gamma=4)


def test_a_drafter_gguf_that_cannot_run_is_refused_before_the_target_loads(tmp_path, gguf_file, cache, monkeypatch):
    import gguf
    import numpy as np

    odd = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(odd), "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loads = []
    monkeypatch.setattr(model_loading, "load_planned", lambda plan, *args: loads.append(plan.role))
    cfg = Config(target=ModelConfig(source=str(gguf_file[0])), drafter=ModelConfig(source=str(odd)))
    with pytest.raises(ModelLoadError, match="drafter odd.gguf: its architecture 'rwkv6' is not one specchat reads"):
        load_pair(cfg)
    assert loads == []  # in the first seconds: nothing was loaded


def test_a_gguf_whose_eos_id_is_past_its_vocabulary_is_refused_in_one_line(tmp_path, tok, cache):
    import struct

    path = write_gguf(tmp_path / "odd-eos.gguf", tiny_qwen2(len(tok)), tok)
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.eos_token_id"
    at = data.index(key) + len(key) + 4  # past the key and its value type: a uint32
    struct.pack_into("<I", data, at, 10**6)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"its EOS token id .* is 1,000,000, past its vocabulary of [\d,]+ tokens"):
        load_pair(Config(target=ModelConfig(source=str(path)), speculation=SpeculationConfig(mode="target")))


def test_interrupted_conversion_leaves_no_cache_entry(gguf_file, cache, monkeypatch):
    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_convert, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        load_model(ModelConfig(source=str(gguf_file[0]), dtype="float32"))
    assert list((cache / "converted").iterdir()) == []


@pytest.mark.parametrize(
    "damage", ["truncated", "flipped byte", "missing file", "unreadable record", "legacy record, truncated"]
)
def test_a_damaged_conversion_is_rebuilt_with_one_notice(gguf_file, tok, cache, damage):
    path, original = gguf_file
    load_model(ModelConfig(source=str(path), dtype="float32"))
    directory = next((cache / "converted").iterdir())
    weights, meta = directory / "model.safetensors", directory / gguf_convert.META
    record = json.loads(meta.read_text())
    assert record["files"]["model.safetensors"]["bytes"] == weights.stat().st_size
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "missing file":
        (directory / "config.json").unlink()
    elif damage == "unreadable record":
        meta.write_text("{not json")
    else:  # written by the previous release: no file records, so only the safetensors check can tell
        meta.write_text(json.dumps({k: v for k, v in record.items() if k != "files"}))
        weights.write_bytes(weights.read_bytes()[:-100])
    seen = []
    model, tokenizer, _ = load_model(
        ModelConfig(source=str(path), dtype="float32"), progress=lambda message, fraction: seen.append(message)
    )
    notices = [m for m in seen if m.startswith("rebuilding the converted checkpoint")]
    assert len(notices) == 1, seen
    assert torch.equal(logits(model, tokenizer), logits(original, tok))
    assert gguf_convert.damage(directory) == ""


def test_a_whole_conversion_is_not_rebuilt_and_records_the_gguf_relative_to_the_cache(gguf_file, cache, monkeypatch):
    path, _ = gguf_file
    load_model(ModelConfig(source=str(path), dtype="float32"))
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a: pytest.fail("converted again"))
    monkeypatch.setattr(cache_folder, "file_sha256", lambda *a: pytest.fail("hashed again"))
    load_model(ModelConfig(source=str(path), dtype="float32"))
    directory = next((cache / "converted").iterdir())
    recorded = gguf_convert.read_meta(directory)["gguf"]
    inside = path.resolve().is_relative_to(cache.resolve())
    assert recorded == (str(path.resolve().relative_to(cache.resolve())) if inside else str(path.resolve()))


def test_two_cold_starts_at_once_convert_once_and_the_second_waits_saying_so(gguf_file, tok, cache, monkeypatch):
    import threading
    import time

    path, original = gguf_file
    calls, converting = [], threading.Event()
    real = gguf_convert.convert_gguf

    def slow_convert(*args):
        calls.append(args)
        converting.set()
        time.sleep(0.5)
        real(*args)

    monkeypatch.setattr(gguf_convert, "convert_gguf", slow_convert)
    messages, loaded = ([], []), {}

    def start(i):
        loaded[i] = load_model(
            ModelConfig(source=str(path), dtype="float32"),
            progress=lambda message, fraction: messages[i].append(message),
        )

    first = threading.Thread(target=start, args=(0,))
    first.start()
    assert converting.wait(60)
    second = threading.Thread(target=start, args=(1,))
    second.start()
    first.join(), second.join()
    assert len(calls) == 1
    assert any(m.startswith("another specchat is building the converted checkpoint") for m in messages[1])
    for model, tokenizer, _ in loaded.values():
        assert torch.equal(logits(model, tokenizer), logits(original, tok))


def test_bundled_source_assembles_converts_then_skips_both(gguf_file, tok, cache, monkeypatch, tmp_path):
    path, original = gguf_file
    data = path.read_bytes()
    parts = []
    for i, chunk in enumerate((data[:1000], data[1000:5000], data[5000:]), start=1):
        parts.append(tmp_path / f"part{i:02d}.bin")
        parts[-1].write_bytes(chunk)
    fake = assets.BundledModel("Tiny-Qwen-Bundled", "fake-part", "0", 3, len(data), hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(assets.BUNDLED, "tiny-qwen", fake)
    monkeypatch.setattr(assets, "find_parts", lambda model: parts)
    seen = []
    model, tokenizer, facts = load_model(
        ModelConfig(source="bundled:tiny-qwen", dtype="float32"),
        progress=lambda message, fraction: seen.append((message, fraction)),
    )
    assert torch.equal(logits(model, tokenizer), logits(original, tok))
    assert facts.name == "Tiny-Qwen-Bundled" and facts.quantization == "ALL_F32"
    assert (cache / "gguf" / fake.filename).read_bytes() == data
    assert any(m.startswith("assembling") and f == 1.0 for m, f in seen)
    assert any(m.startswith("converting Tiny-Qwen-Bundled") for m, _ in seen)
    assert any(m.startswith("dequantizing") and f == 1.0 for m, f in seen)
    monkeypatch.setattr(assets, "find_parts", lambda model: pytest.fail("assembled again"))
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a: pytest.fail("converted again"))
    load_model(ModelConfig(source="bundled:tiny-qwen", dtype="float32"))


# ----- bitsandbytes on the CPU ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "quantization, layer", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt"), ("int8", "Int8Linear")]
)
def test_bitsandbytes_target_gives_exact_greedy_speculation(target_dir, drafter_dir, tok, cache, quantization, layer):
    cfg = local_cfg(str(target_dir[0]), str(drafter_dir[0]), quantization=quantization)
    pair = load_pair(cfg)
    assert type(pair.target.model.layers[0].mlp.up_proj).__name__ == layer
    assert pair.target_facts.quantization == quantization
    assert pair.sampler is TORCH_SAMPLER  # no compiled module in this pair: the torch code samples
    assert pair.target_facts.params == sum(p.numel() for p in target_dir[1].parameters())
    assert pair.target_facts.memory_bytes < target_dir[1].get_memory_footprint()
    for text in (PROMPT, "The quick brown", "Hello, how are you"):
        ids = tok.encode(text)
        assert greedy_reply(pair, "spec", ids, n=32) == greedy_reply(pair, "target", ids, n=32)


@pytest.mark.parametrize("quantization, head, passes", [("int8", "Int8Linear", None), ("w8a8-fast", "W8A8Linear", {1})])
def test_quantized_drafters_keep_greedy_speculation_exact(
    target_dir, drafter_dir, tok, cache, quantization, head, passes
):
    cfg = local_cfg(str(target_dir[0]), str(drafter_dir[0]))
    pair = load_pair(replace(cfg, drafter=replace(cfg.drafter, quantization=quantization)))
    assert type(pair.drafter.lm_head).__name__ == head
    assert pair.drafter_facts.quantization == quantization
    if passes:  # 8-bit activations everywhere: one pass on every layer, the MLP and the head too
        assert {m.passes for m in pair.drafter.modules() if type(m).__name__ == head} == passes
    for text in (PROMPT, "The quick brown"):
        ids = tok.encode(text)
        assert greedy_reply(pair, "spec", ids, n=32) == greedy_reply(pair, "target", ids, n=32)


def test_gguf_source_can_be_quantized_again_by_bitsandbytes(gguf_file, cache):
    model, _, facts = load_model(ModelConfig(source=str(gguf_file[0]), dtype="float32", quantization="4bit"))
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    assert facts.quantization == "ALL_F32→4bit"


def test_bitsandbytes_configs_are_nf4_double_quant_with_compute_dtype():
    four = devices.quantization_config("4bit", torch.bfloat16)
    assert four.load_in_4bit and four.bnb_4bit_quant_type == "nf4" and four.bnb_4bit_use_double_quant
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    eight = devices.quantization_config("8bit", torch.float16)
    assert eight.load_in_8bit and eight.llm_int8_threshold == 0.0  # batch-invariant, see devices.py
    assert devices.quantization_config("none", torch.float32) is None


# ----- devices, dtypes and placement ---------------------------------------------------------------
def test_placement_for_one_device_and_for_device_map_auto():
    one = devices.placement_kwargs(ModelConfig(), "drafter", "cpu", torch.float32)
    assert one == {"dtype": torch.float32, "device_map": {"": "cpu"}}
    spread = ModelConfig(device_map="auto", max_memory={"0": "20GiB", "1": 2**34, "cpu": "64GiB"}, quantization="4bit")
    kwargs = devices.placement_kwargs(spread, "target", "cuda", torch.bfloat16)
    assert kwargs["device_map"] == "auto"
    assert kwargs["max_memory"] == {0: "20GiB", 1: 2**34, "cpu": "64GiB"}
    assert kwargs["quantization_config"].load_in_4bit and kwargs["dtype"] == torch.bfloat16


@pytest.mark.parametrize(
    "mc, role, message",
    [
        (ModelConfig(device_map="auto"), "drafter", "drafter.device_map must be empty"),
        (
            ModelConfig(device_map="auto", max_memory={"gpu0": "8GiB"}),
            "target",
            "max_memory key 'gpu0' must be a GPU index",
        ),
        (
            ModelConfig(device_map="auto", max_memory={"0": 8.5}),
            "target",
            r"max_memory\[0\] must be a size such as \"20GiB\" or a byte count, got 8.5",
        ),
        (ModelConfig(max_memory={"0": "8GiB"}), "target", "target.max_memory needs target.device_map"),
    ],
)
def test_placement_errors(mc, role, message):
    with pytest.raises(ModelLoadError, match=message):
        devices.placement_kwargs(mc, role, "cpu", torch.float32)


def test_dtype_auto_follows_the_cpu_flags(tmp_path, monkeypatch):
    with_bf16, without = tmp_path / "a", tmp_path / "b"
    with_bf16.write_text("processor : 0\nflags : fpu sse avx512f avx512_bf16\n")
    without.write_text("processor : 0\nflags : fpu sse avx2\n")
    assert devices.cpu_has_fast_bf16(with_bf16) and not devices.cpu_has_fast_bf16(without)
    assert not devices.cpu_has_fast_bf16(tmp_path / "missing")
    monkeypatch.setattr(devices, "CPUINFO", without)
    assert devices.resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(devices, "CPUINFO", with_bf16)
    assert devices.resolve_dtype("auto", "cpu") == torch.bfloat16
    assert devices.resolve_dtype("float16", "cpu") == torch.float16


def test_dtype_auto_on_a_gpu_asks_that_gpu_for_native_bf16(monkeypatch):
    """A T4 (7.5) or V100 (7.0) only emulates bf16: float16 there; an A100 (8.0) or later: bf16."""
    capabilities = {0: (7, 5), 1: (8, 0), 2: (7, 0)}
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or capabilities[index])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: pytest.fail("asks the current device only"))
    assert devices.resolve_dtype("auto", "cuda") == torch.float16
    assert devices.resolve_dtype("auto", "cuda:1") == torch.bfloat16
    assert devices.resolve_dtype("auto", "cuda:2") == torch.float16
    assert asked == [0, 1, 2]


def test_a_pair_split_over_device_types_is_refused_before_loading(monkeypatch):
    devices.check_device_types("cuda:0", "cuda:1")  # two GPUs: one generator type serves both
    with pytest.raises(ModelLoadError, match="the target is on cuda and the drafter on cpu: put both on") as err:
        devices.check_device_types("cuda", "cpu")
    assert "\n" not in str(err.value)
    monkeypatch.setattr(planning, "resolve_device", lambda device: device)
    monkeypatch.setattr(model_loading, "load_planned", lambda *a, **k: pytest.fail("loaded before the check"))
    target = ModelConfig(source="t", device="cuda", dtype="float32")  # its plan asks no GPU for its dtype
    cfg = Config(target=target, drafter=ModelConfig(source="d", device="cpu"))
    with pytest.raises(ModelLoadError, match="put both on"):
        load_pair(cfg)


def test_missing_gpu_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device("auto") == "cpu"
    with pytest.raises(ModelLoadError, match="device cuda:1 was asked for, but torch sees no CUDA GPU"):
        devices.resolve_device("cuda:1")


# ----- sources and their errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "source, message",
    [
        ("", "the model source is empty"),
        ("/nonexistent/model.gguf", "does not exist"),
        ("./no/such/dir", "does not exist"),
        ("bundled:qwen9-huge", "unknown bundled model 'qwen9-huge'; bundled models are qwen2.5-coder-1.5b"),
        ("what is this?", "neither a hub id"),
    ],
)
def test_bad_sources_are_one_line_errors(source, message):
    with pytest.raises(ModelLoadError, match=message) as err:
        load_model(ModelConfig(source=source))
    assert "\n" not in str(err.value)


def test_directory_without_config_and_non_gguf_file(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model(ModelConfig(source=str(tmp_path)))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file but not a .gguf file"):
        load_model(ModelConfig(source=str(tmp_path / "weights.bin")))


def test_corrupt_gguf_is_a_one_line_error(tmp_path, cache):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(ModelLoadError, match="broken.gguf is not a readable GGUF file"):
        load_model(ModelConfig(source=str(tmp_path / "broken.gguf")))


def test_revision_only_for_hub_ids(target_dir):
    with pytest.raises(ModelLoadError, match="revision = 'main' only applies to hub ids"):
        load_model(ModelConfig(source=str(target_dir[0]), revision="main"))


def test_hub_id_without_network_says_how_to_work_offline(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never touch the network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelConfig(source="specchat-tests/no-such-model-1b"))
    message = str(err.value)
    assert message.startswith("cannot load the model of specchat-tests/no-such-model-1b from the Hugging Face hub")
    assert "HF_HUB_OFFLINE" in message and "local directory" in message and "\n" not in message


# ----- the real bundled pair ---------------------------------------------------------------------------
@pytest.mark.slow
def test_bundled_pair_greedy_speculation_equals_target_only():
    """Assembles and converts on the first run (minutes, float32 cache), then loads in seconds."""
    from specchat.settings import load_config

    cfg = load_config(
        None,
        ["target.dtype=float32", "drafter.dtype=float32", "target.quantization=none", "target.backend=transformers"],
    )
    pair = load_pair(cfg)
    assert pair.target_facts.name == "Qwen2.5-Coder-1.5B-Instruct"
    assert pair.drafter_facts.name == "Qwen2.5-Coder-0.5B-Instruct"
    assert pair.target_facts.quantization == "Q4_K_M" and pair.target_facts.dtype == "float32"
    assert pair.target_facts.template == pair.drafter_facts.template == "own"  # from the GGUF
    assert pair.tokenizer.convert_tokens_to_ids("<|im_end|>") in pair.eos_ids
    assert pair.context_limit == 32768 and pair.vocab_size == len(pair.tokenizer)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that reverses a string."},
    ]
    ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    spec = greedy_reply(pair, "spec", ids, n=24)
    assert len(spec) == 24
    assert spec == greedy_reply(pair, "target", ids, n=24)
    assert "def" in pair.tokenizer.decode(spec)


@pytest.mark.slow
def test_bundled_pair_as_the_chat_loads_it_is_exact_in_its_own_dtype():
    """The default config (w4a8 target on the GGUF's own Q4_K blocks, w4a8-fast drafter, lean forwards):
    speculative == target-only for gamma 1, 4 and 8 over a longer reply, in the dtype the chat runs."""
    from specchat.settings import load_config

    pair = load_pair(load_config(None, []))
    assert pair.target_facts.backend == pair.drafter_facts.backend == "lean (compiled layers)"
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Explain what a Python generator is, with an example."},
    ]
    ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    target_only = greedy_reply(pair, "target", ids, n=48)
    assert all(greedy_reply(pair, "spec", ids, n=48, gamma=g) == target_only for g in (1, 4, 8))


def test_unknown_context_length_asks_for_ui_context_limit():
    from types import SimpleNamespace

    from specchat.loading.models import context_limit

    target = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: SimpleNamespace()))
    endless = SimpleNamespace(model_max_length=int(1e30))
    with pytest.raises(ModelLoadError, match="set ui.context_limit"):
        context_limit(Config(), target, endless)
    assert context_limit(Config(), target, SimpleNamespace(model_max_length=2048)) == 2048
    assert context_limit(Config(ui=UIConfig(context_limit=99)), target, endless) == 99


def test_one_line_keeps_the_first_meaningful_line():
    from specchat.errors import one_line

    assert one_line(OSError("\n  first problem  \nTraceback (most recent call last):\n ...")) == "first problem"
    assert one_line(ValueError()) == "ValueError"
    assert len(one_line(RuntimeError("x" * 1000))) == 240


def test_broken_local_checkpoints_are_one_line_errors(tmp_path, tok):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"cannot load the model of junk from .*junk: ") as err:
        load_model(ModelConfig(source=str(tmp_path / "junk")))
    assert "\n" not in str(err.value)
    weights_only = tmp_path / "weights-only"
    build_model(len(tok), seed=7).save_pretrained(weights_only)
    with pytest.raises(ModelLoadError, match="cannot load the tokenizer of weights-only from") as err:
        load_model(ModelConfig(source=str(weights_only), dtype="float32"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("mode", ["w8a8", "w4a8", "w4a8-fast"])
def test_w8a8_off_the_cpu_loads_unquantized_with_one_notice(mode):
    from specchat.config import ModelConfig
    from specchat.loading.quantization_choice import runnable_quantization

    notices = []
    mc = ModelConfig(source="bundled:x", quantization=mode)
    on_gpu = runnable_quantization(mc, "cuda:0", "target", lambda m, f: notices.append(m))
    assert on_gpu.quantization == "none" and notices == [
        f"target: quantization {mode} runs on the CPU only; loading it unquantized on cuda:0"
    ]
    assert runnable_quantization(mc, "cpu", "target") is mc  # as resolve_device names devices
