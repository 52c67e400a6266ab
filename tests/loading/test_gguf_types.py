"""The block types people download (loading/gguf/blocks.py): Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and
IQ4_XS run on the w4a8 kernel bit for bit, every other type (Q3_K here) is requantized to the kernel's 6-bit levels,
said in one notice line a model; each loads with the
default config, stays exact (greedy speculative == greedy target-only), and its w4a8 weights are the file's
dequantized ones to within a 6-bit step. A type gguf-py cannot dequantize is one line, not a traceback.

The files are tiny models of 256-wide rows (the K types' blocks are 256 weights): gguf-py's own quantization of
random weights for Q8_0, Q4_0 and Q5_0, random blocks with small fp16 scales for Q4_K, Q5_K, Q6_K, Q3_K, IQ4_NL and
IQ4_XS."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from model_files import BLOCK_SCALES, BLOCK_WIDE, greedy_reply, random_blocks, tiny_model, typed_pair_files, vocab_size
from test_gguf_architectures import cache, on_the_cpu, tok

from specchat.config import ModelConfig
from specchat.errors import ModelLoadError
from specchat.loading.gguf.blocks import AS_STORED as AS_STORED_DECODERS
from specchat.loading.gguf.blocks import _decoded, decode_q5_k, requantized_notice
from specchat.loading.models import load_model, load_pair
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import Q4Linear
from specchat.settings import load_config

FIXTURES = (cache, on_the_cpu, tok)  # test_gguf_architectures' autouse fixtures, on here too

pytestmark = pytest.mark.usefixtures("one_thread")

AS_STORED = {"Q4_K": 4, "Q5_K": 6, "Q6_K": 6, "Q4_0": 4, "Q4_1": 4, "Q5_0": 6, "Q5_1": 6, "Q8_0": 8}  # held as they are
AS_STORED |= {"IQ4_NL": 4, "IQ4_XS": 4}  # bits a level (IQ4's: 4-bit indices into its table)
FAST = [("Q4_K", "qwen2"), ("Q5_K", "llama"), ("Q6_K", "qwen3"), ("Q8_0", "qwen2"), ("Q4_0", "llama")]
FAST += [("IQ4_XS", "qwen2"), ("IQ4_NL", "llama"), ("Q3_K", "qwen2")]
ALL = [
    (kind, architecture)
    for kind in ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "IQ4_XS", "IQ4_NL", "Q3_K")
    for architecture in ("llama", "qwen2", "qwen3")
]
SLOW = [pytest.param(*case, marks=pytest.mark.slow) for case in ALL if case not in FAST]
FIDELITY = "fidelity: python -m specchat.bench.targets --gguf FILE"
HELD = "(the kernel holds Q4_K, Q5_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K, IQ4_NL and IQ4_XS as is)"


def prompt_ids(tok) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": "def reverse(lst):"}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(text)


def stored_tensor(path, name: str):
    return next(tensor for tensor in GGUFReader(str(path)).tensors if tensor.name == name)


def within_a_step(quantized: torch.Tensor, wanted: torch.Tensor, bits: int) -> bool:
    """Each weight within one step of `bits` levels of the widest 32-group of its 256-block (half a step of
    rounding, and the rounding of the groups' scales and offsets to 8 bits)."""
    rows, width = wanted.shape
    groups = wanted.reshape(rows, width // 256, 8, 32)
    span = groups.amax(dim=3) - groups.amin(dim=3).clamp(max=0)
    step = span.amax(dim=2, keepdim=True) / (2**bits - 1)  # [rows, blocks, 1]
    error = (quantized - wanted).abs().reshape(rows, width // 256, 256)
    return bool((error <= step + 1e-7).all())


@pytest.mark.parametrize("kind, architecture", FAST + SLOW)
def test_a_file_of_each_type_loads_with_the_default_config_and_stays_exact(tmp_path, tok, kernel, kind, architecture):
    target, drafter = typed_pair_files(tmp_path, tok, kind, architecture)
    lines = []
    pair = load_pair(
        load_config(None, [f"target.source={target}", f"drafter.source={drafter}"]),
        lambda message, fraction: lines.append(message),
    )
    said = [line for line in lines if "requantized" in line]
    if kind in AS_STORED:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(f"target target: 15 {kind} tensors requantized to 6-bit w4a8")
        assert said[0].endswith(f"{HELD}; {FIDELITY}")
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)

    floats, _, _ = load_model(ModelConfig(source=str(target), quantization="none", dtype="float32", device="cpu"))
    wanted = dict(floats.named_modules())
    layers = {name: layer for name, layer in pair.target.named_modules() if isinstance(layer, Q4Linear)}
    assert len(layers) == 15  # 7 a layer, and the head
    for name, layer in layers.items():
        weights = wanted[name].weight.detach()
        if kind in AS_STORED:
            assert layer.tiles.bits == AS_STORED[kind] and torch.equal(layer.tiles.dequantize(), weights), name
        else:
            assert layer.tiles.bits == 6 and within_a_step(layer.tiles.dequantize(), weights, 6), name


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_q4_0_and_q8_0_files_load_unquantized_from_their_full_conversion(tmp_path, tok, kind):
    target, drafter = typed_pair_files(tmp_path, tok, kind, "qwen2")
    pair = load_pair(
        load_config(None, [f"target.source={target}", f"drafter.source={drafter}", "target.quantization=none"])
    )
    stored = stored_tensor(target, "blk.0.ffn_down.weight")
    weights = torch.from_numpy(dequantize(stored.data, stored.tensor_type).astype(np.float32))
    assert torch.equal(pair.target.model.layers[0].mlp.down_proj.weight.float(), weights.to(pair.target.dtype).float())
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


@pytest.mark.parametrize("kind", ["Q5_K", "Q6_K", "Q3_K"])
def test_the_full_conversion_path_takes_q5_k_and_q6_k_as_stored_and_says_what_it_requantized(
    tmp_path, tok, kernel, monkeypatch, kind
):
    """An architecture that does not stream (here: as if) is converted in full; its w4a8 layers still take the
    file's Q5_K and Q6_K blocks bit for bit, and requantize Q3_K with one notice."""
    from specchat.loading.gguf import tensors

    monkeypatch.setattr(tensors, "streamable", lambda gguf: False)
    target, drafter = typed_pair_files(tmp_path, tok, kind, "qwen2")
    lines = []
    pair = load_pair(
        load_config(None, [f"target.source={target}", f"drafter.source={drafter}"]),
        lambda message, fraction: lines.append(message),
    )
    said = [line for line in lines if "requantized" in line]
    down = pair.target.model.layers[0].mlp.down_proj
    assert isinstance(down, Q4Linear) and down.tiles.bits == 6
    if kind in AS_STORED:
        stored = stored_tensor(target, "blk.0.ffn_down.weight")
        decoded = AS_STORED_DECODERS[kind][1](torch.from_numpy(np.array(stored.data)))
        assert said == [] and all(torch.equal(a, b) for a, b in zip(down.tiles.to_block().tensors(), decoded.tensors()))
    else:
        assert len(said) == 1 and said[0].startswith("target target: 15 Q3_K tensors requantized to 6-bit w4a8 levels")


def test_decoded_q5_k_blocks_give_gguf_pys_own_weights():
    raw = random_blocks("Q5_K", 6, 512, seed=4)
    expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q5_K).astype(np.float32))
    block = decode_q5_k(torch.from_numpy(raw))
    assert block.bits == 6 and block.d.shape == (6, 2) and int(block.sc.max()) <= 63
    assert torch.equal(block.dequantize(), expected)


@pytest.mark.parametrize("kind", ["Q6_K", "IQ4_NL", "IQ4_XS"])
def test_decoded_q6_k_and_iq4_blocks_give_gguf_pys_own_weights_through_the_tiles(kind):
    """Q6_K and IQ4_XS in halves (a signed int8 scale per 16 inputs), IQ4_NL as one-group 8-bit blocks; both signs of
    d and of the scales; the tiles the kernel reads hold the same weights."""
    raw = random_blocks(kind, 20, 512, seed=5)
    weights, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw.reshape(20, 512 // weights, size)[::2, :, BLOCK_SCALES[kind][0][0] + 1] |= 0x80  # every other row's d < 0
    expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32))
    block = AS_STORED_DECODERS[kind][1](torch.from_numpy(raw))
    assert (
        block.bits == AS_STORED[kind] and block.halves == (kind != "IQ4_NL") and block.table == kind.startswith("IQ4")
    )
    if block.halves:
        assert int(block.sc.min()) < 0 < int(block.sc.max())
    assert torch.equal(block.dequantize(), expected)
    assert torch.equal(Q4Tiles.from_block(block).dequantize(), expected)


def test_a_tall_tensor_is_decoded_a_few_rows_at_a_time_to_the_same_block(monkeypatch):
    from specchat.loading.gguf import blocks

    raw = torch.from_numpy(random_blocks("Q6_K", 40, 512, seed=7))
    whole = _decoded("Q6_K", raw)
    monkeypatch.setattr(blocks, "QUANTIZE_ROWS", 16)
    parts = _decoded("Q6_K", raw)
    assert all(torch.equal(a, b) for a, b in zip(parts.tensors(), whole.tensors()))


def test_a_q6_k_scale_past_what_the_kernel_holds_is_requantized_not_an_error():
    raw = random_blocks("Q6_K", 4, 256, seed=6)
    raw[:, 208:210] = np.array([60000.0], dtype=np.float16).view(np.uint8)  # 32·d is past float16
    with pytest.raises(ValueError, match="too large"):
        AS_STORED_DECODERS["Q6_K"][1](torch.from_numpy(raw))
    assert _decoded("Q6_K", torch.from_numpy(raw)) is None


def test_a_type_gguf_py_cannot_dequantize_is_one_line(tmp_path, tok):
    import gguf

    model = tiny_model("qwen2", vocab_size(tok), seed=1, **BLOCK_WIDE)
    path = tmp_path / "q8_1.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    from model_files import _gguf_tensors, _write_gguf_header, _write_gguf_tokenizer
    from tiny_models import CHATML

    _write_gguf_header(writer, model.config)
    _write_gguf_tokenizer(writer, tok, CHATML)
    for name, values in _gguf_tensors(model, "qwen2"):
        if name == "blk.0.ffn_up.weight":
            raw = np.zeros((values.shape[0], values.shape[1] // 32 * 40), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType.Q8_1)
        else:
            writer.add_tensor(name, values)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    for quantization in ("w4a8", "none"):
        with pytest.raises(ModelLoadError) as caught:
            load_model(ModelConfig(source=str(path), quantization=quantization, dtype="float32", device="cpu"))
        message = str(caught.value)
        assert "\n" not in message and "Q8_1" in message, message
        assert "cannot dequantize" in message or "not yet implemented" in message, message


def test_the_notice_names_each_type_and_its_count():
    from collections import Counter

    assert requantized_notice(Counter(), 6) is None
    assert requantized_notice(Counter({"Q2_K": 169, "Q3_K": 28}), 6) == (
        f"169 Q2_K and 28 Q3_K tensors requantized to 6-bit w4a8 levels {HELD}; {FIDELITY}"
    )
    assert requantized_notice(Counter({"Q5_K": 1}), 4).startswith(
        "1 Q5_K tensor requantized to 4-bit w4a8 levels (the kernel holds Q4_K, Q4_0, Q4_1, IQ4_NL and IQ4_XS as is)"
    )


def test_the_notice_reaches_a_json_one_shot_once_on_stderr_and_the_json_stays_whole(tmp_path, tok, kernel):
    """The notice goes where every load notice goes: the start's lines (stderr), once; stdout is the JSON alone."""
    import io
    import json

    from specchat.tui.cli import main

    target, drafter = typed_pair_files(tmp_path, tok, "Q3_K", "qwen2")
    out, err = io.StringIO(), io.StringIO()
    argv = ["--json", "--prompt", "hi", "--target", str(target), "--drafter", str(drafter), "sampling.max_new_tokens=4"]
    assert main(argv, compare=None, stdin=io.StringIO(), stdout=out, stderr=err) == 0, err.getvalue()
    said = [line for line in err.getvalue().splitlines() if "requantized" in line]
    assert said == [f"target target: 15 Q3_K tensors requantized to 6-bit w4a8 levels {HELD}; {FIDELITY}"]
    assert json.loads(out.getvalue())["stats"]["new_tokens"] == 4


def test_the_fidelity_bench_compares_a_file_with_its_own_dequantized_weights(tmp_path, tok, kernel, capsys):
    from specchat.bench import targets

    target, _ = typed_pair_files(tmp_path, tok, "Q3_K", "qwen2")
    assert targets.main(["--gguf", str(target), "--tokens", "64"]) == 0
    types, reference, result = capsys.readouterr().out.strip().splitlines()
    assert (
        types == "target: linear-layer tensors 15 Q3_K; w4a8 holds as stored: none; requantizes to 6-bit levels: Q3_K"
    )
    assert reference == "float32 reference over 64 tokens"
    assert "→w4a8" in result and " · top-1 " in result and result.endswith(" over 64 tokens") and " ms" not in result


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_a_file_written_again_in_another_type_holds_its_weights_in_that_type(tmp_path, tok, kernel, capsys, kind):
    """bench.retype: a Q6_K file's weights written again with gguf-py's quantizer; the new file's tensors decode to
    the old ones quantized in `kind`, and the fidelity bench reads them as stored."""
    from gguf.quants import quantize

    from specchat.bench import retype, targets

    source, _ = typed_pair_files(tmp_path, tok, "Q6_K", "qwen2")
    out = tmp_path / f"again-{kind}.gguf"
    assert retype.main([str(source), str(out), "--type", kind]) == 0
    before, after = stored_tensor(source, "blk.1.ffn_up.weight"), stored_tensor(out, "blk.1.ffn_up.weight")
    assert after.tensor_type.name == kind
    wanted = quantize(dequantize(before.data, before.tensor_type).astype(np.float32), GGMLQuantizationType[kind])
    assert np.array_equal(np.asarray(after.data), wanted)
    assert stored_tensor(out, "blk.1.attn_norm.weight").tensor_type.name == "F32"
    assert GGUFReader(str(out)).get_field("tokenizer.chat_template") is not None
    capsys.readouterr()
    assert targets.main(["--gguf", str(out), "--tokens", "32"]) == 0
    types = capsys.readouterr().out.splitlines()[0]
    assert (
        types
        == f"again-{kind}: linear-layer tensors 15 {kind}; w4a8 holds as stored: {kind}; requantizes to 6-bit levels: none"
    )


def test_the_retype_and_llamacpp_options_say_what_they_need(tmp_path, capsys):
    from specchat.bench import retype, targets

    assert retype.main([str(tmp_path / "none.gguf"), str(tmp_path / "out.gguf"), "--type", "Q8_0"]) == 2
    assert targets.main(["--llamacpp"]) == 2
    err = capsys.readouterr().err
    assert "specchat bench retype: error: " in err and "none.gguf" in err
    assert "--llamacpp needs --gguf FILE" in err
