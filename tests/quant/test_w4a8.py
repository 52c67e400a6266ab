"""w4a8: 4-bit weights × 8-bit activations on specchat's own kernel (quant/w4a8.py, q4_block.py, q4_tiles.py,
q4_levels.py, kernels/q4/q4_kernel.cpp).
The code paths side by side: test_kernel_paths.py."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_greedy_spec_is_target_only, assert_multi_turn_exact, noisy_head_copy
from tiny_models import build_model

from specchat import cache_folder
from specchat.config import AUTO
from specchat.loading import stored_weights
from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_levels import LEVEL_BITS
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import Q4Linear, quantize_w4a8, run_kernel
from specchat.runtime.attention import use_batch_invariant_attention


def integer_reference(x: torch.Tensor, block: Q4Block) -> torch.Tensor:
    """W x the long way, in float64 from integers: x mapped per row and block onto int8 (amax/127,
    ties to even), each 32-group's integer dot product scaled by its weights' d·sc and offset dmin·m."""
    rows, width = x.shape
    outs, blocks = block.d.shape
    per_block = width // blocks // 32
    xb = x.double().view(rows, blocks, width // blocks)
    act_scale = xb.abs().amax(dim=2) / 127  # [M, blocks]
    acts = torch.round(xb / act_scale.clamp(min=1e-300)[..., None]).view(rows, width // 32, 32)
    levels = LEVEL_BITS[block.bits][1](block.qs)  # [out, in/32, 32]
    dots = torch.einsum("ngk,mgk->mng", levels.double(), acts)  # [M, out, in/32]
    sums = acts.sum(dim=2)  # [M, in/32]
    step = block.d.double().repeat_interleave(per_block, dim=1) * block.sc.double()  # [out, in/32]
    offset = block.dmin.double().repeat_interleave(per_block, dim=1) * block.m.double()
    scale_of_group = act_scale.repeat_interleave(per_block, dim=1)  # [M, in/32]
    return ((dots * step - sums[:, None, :] * offset) * scale_of_group[:, None, :]).sum(dim=2)


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("width", [384, 512])  # blocks of 128 and of 256 inputs
def test_the_kernel_equals_an_integer_reference_and_is_close_to_the_float_product(kernel, width, bits):
    torch.manual_seed(0)
    weight = torch.randn(96, width) * 0.05
    x = torch.randn(6, width)
    x[:, 7] *= 40  # an outlier channel costs precision only inside its 128-block
    block = Q4Block.quantize(weight, bits)
    out = run_kernel(kernel.q4_linear, x, Q4Tiles.from_block(block))
    reference = integer_reference(x, block)
    assert torch.allclose(out.double(), reference, rtol=1e-5, atol=1e-5 * reference.abs().max().item())
    exact = x @ weight.T
    assert ((out - exact).norm() / exact.norm()) < {4: 0.12, 6: 0.05, 8: 0.04}[bits]
    assert ((out - x @ block.dequantize().T).norm() / exact.norm()) < 0.04  # the activations' own rounding


def test_weights_already_on_a_4bit_grid_come_back_exactly():
    torch.manual_seed(1)
    levels = torch.randint(
        0,
        16,
        (
            8,
            256,
        ),
        dtype=torch.int64,
    ).view(8, 8, 32)
    levels[:, :, 0], levels[:, :, 1] = 0, 15  # each group spans its whole range
    step = torch.tensor([255, 128, 64, 32]).repeat(8, 2) / 256  # [8, 8]: whole multiples of the block's unit
    weight = (levels * step[..., None] - 4 * step[..., None]).view(8, 256)
    block = Q4Block.quantize(weight)
    assert int(block.qs.max()) > 15 and torch.equal(block.dequantize(), weight)


def test_quantizing_keeps_levels_in_range_and_a_gaussian_weight_close():
    torch.manual_seed(2)
    weight = torch.randn(64, 512)
    block = Q4Block.quantize(weight)
    assert block.qs.dtype == torch.uint8 and block.qs.shape == (64, 256) and block.d.shape == (64, 2)
    assert Q4Block.quantize(torch.randn(4, 384)).d.shape == (4, 3)  # 128-wide blocks where 256 do not fit
    assert Q4Block.quantize(torch.randn(4, 192)).d.shape == (4, 3)  # 64-wide where 128 do not fit either
    assert ((block.dequantize() - weight).norm() / weight.norm()) < 0.1
    with pytest.raises(ValueError, match="divisible by 64"):
        Q4Block.quantize(torch.randn(4, 96))
    fine = Q4Block.quantize(weight, bits=8)
    assert fine.qs.shape == (64, 512) and int(fine.qs.max()) == 255
    assert ((fine.dequantize() - weight).norm() / weight.norm()) < 0.01
    six = Q4Block.quantize(weight, bits=6)
    assert six.qs.shape == (64, 384) and six.bits == 6
    assert ((six.dequantize() - weight).norm() / weight.norm()) < 0.025
    with pytest.raises(ValueError, match="4, 6 or 8 bits"):
        Q4Block.quantize(weight, bits=5)


@pytest.mark.parametrize("magnitude", [1e-5, 0.02, 1.0, 300.0])
def test_block_scales_are_float16_values_and_still_fit_the_weights(magnitude):
    """The tiles store d and dmin as float16 (Q4_K's width), so the quantizer picks float16 values, rounding a
    unit up where it must: the largest count stays within 255 and the weights within the step they had."""
    torch.manual_seed(3)
    weight = torch.randn(32, 512) * magnitude
    for bits in (4, 6):
        block = Q4Block.quantize(weight, bits=bits)
        for scales in (block.d, block.dmin):
            assert scales.dtype == torch.float32 and torch.equal(scales.half().float(), scales)
        assert int(block.sc.max()) <= 255 and int(block.m.max()) <= 255
        assert ((block.dequantize() - weight).norm() / weight.norm()) < (0.1 if bits == 4 else 0.025)
        tiles = Q4Tiles.from_block(block)
        assert tiles.d.dtype == torch.float16 and tiles.dmin.dtype == torch.float16
        assert torch.equal(tiles.to_block().dequantize(), block.dequantize())


def test_a_block_whose_scales_are_not_float16_values_is_refused_not_rounded():
    block = Q4Block.quantize(torch.randn(16, 256))
    off_grid = Q4Block(block.qs, block.sc, block.m, block.d * (1 + 2**-20), block.dmin)
    with pytest.raises(ValueError, match="float16 values"):
        Q4Tiles.from_block(off_grid)


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_levels_packed_for_the_kernel_unpack_to_themselves(bits):
    levels = torch.randint(0, 2**bits, (3, 12, 32), dtype=torch.uint8)
    levels[0, 0] = 2**bits - 1  # every bit set somewhere
    pack, unpack = LEVEL_BITS[bits]
    assert torch.equal(unpack(pack(levels)), levels)


def test_tiles_made_a_few_rows_at_a_time_are_the_tiles_made_at_once(monkeypatch):
    """from_block takes a head-sized block QUANTIZE_ROWS rows at a time (its temporaries bounded): the same tiles."""
    from specchat.quant import q4_tiles

    for bits in (4, 6):
        block = Q4Block.quantize(torch.randn(100, 128), bits)
        whole = Q4Tiles.from_block(block)
        monkeypatch.setattr(q4_tiles, "QUANTIZE_ROWS", 32)
        parts = Q4Tiles.from_block(block)
        monkeypatch.undo()
        assert parts.outs == whole.outs == 100
        assert all(torch.equal(a, b) for a, b in zip(parts.tensors(), whole.tensors())), bits


def test_six_bit_levels_keep_their_top_bits_where_the_kernel_reads_them():
    levels = torch.zeros(1, 2, 32, dtype=torch.uint8)
    levels[0, 0, 3], levels[0, 0, 19], levels[0, 1, 5], levels[0, 1, 21] = 0x10, 0x20, 0x30, 0x1F
    packed = LEVEL_BITS[6][0](levels)[0]
    assert packed.shape == (48,) and int(packed[21]) == 0xF0  # level 21 of the second group: low nibble 15
    tops = packed[32:]
    assert int(tops[3]) == 1 << 4 | 2 << 6  # the first group's levels 3 (bits 4-5) and 19 (bits 6-7)
    assert int(tops[5]) == 3 | 1 << 2  # the second group's levels 5 (bits 0-1) and 21 (bits 2-3)
    assert int(tops.sum()) - int(tops[3]) - int(tops[5]) == 0


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 13])
def test_a_row_gets_bitwise_the_same_result_alone_or_anywhere_in_a_batch(kernel, rows, bits):
    torch.manual_seed(3)
    layer = Q4Linear(Q4Block.quantize(torch.randn(200, 640) * 0.1, bits), None, kernel.q4_linear)
    row = torch.randn(1, 640)
    alone = layer(row)
    for position in range(rows):
        batch = torch.randn(rows, 640) * 3
        batch[position] = row[0]
        assert torch.equal(layer(batch)[position], alone[0])


@pytest.mark.parametrize("index", [slice(0, 64), slice(32, 200), torch.tensor([199, 3, 64, 17])])
def test_a_layer_of_some_output_rows_gives_those_columns_of_the_whole_layer(kernel, index):
    """A drafter's head for the ids below its limit (whole tiles, views) or for ids seen in the chat."""
    torch.manual_seed(8)
    layer = Q4Linear(Q4Block.quantize(torch.randn(200, 640) * 0.1, 6), None, kernel.q4_linear)
    x = torch.randn(5, 640)
    assert torch.equal(layer.rows(index)(x), layer(x)[:, index])


def w4a8_model(model: torch.nn.Module, kernel, dtype: torch.dtype) -> torch.nn.Module:
    quantized = copy.deepcopy(model)
    quantize_w4a8(quantized, None, kernel)
    use_batch_invariant_attention(quantized)
    return quantized.to(dtype)


@pytest.fixture(scope="module")
def w4a8_pair(tokenizer, kernel):
    target = build_model(len(tokenizer), seed=1, layers=3, hidden=256)
    return w4a8_model(target, kernel, torch.bfloat16), w4a8_model(noisy_head_copy(target), kernel, torch.bfloat16)


@pytest.mark.parametrize("gamma", [1, 4, 8, AUTO])
@pytest.mark.parametrize("text", ["def reverse(lst):", "The quick brown"])
def test_greedy_speculative_equals_target_only_with_a_w4a8_target_in_bf16(w4a8_pair, tokenizer, gamma, text):
    assert_greedy_spec_is_target_only(*w4a8_pair, tokenizer, text, gamma)


def test_a_multi_turn_w4a8_reply_stays_exact_when_the_cache_is_reused(w4a8_pair, tokenizer):
    assert_multi_turn_exact(*w4a8_pair, tokenizer)


def test_the_w4a8_stored_weights_round_trip_without_quantizing_again(tmp_path, tokenizer, monkeypatch, kernel):
    model = build_model(len(tokenizer), seed=1, layers=2, hidden=128)
    path = tmp_path / "model-float32-w4a8.safetensors"
    first = copy.deepcopy(model)
    assert stored_weights.load_or_quantize(first, path, "tiny", "w4a8") is None and path.exists()
    with monkeypatch.context() as patch:  # the second start must not quantize at all, nor hash what the first hashed
        patch.setattr(Q4Block, "quantize", lambda weight: pytest.fail("quantized again"))
        patch.setattr(cache_folder, "file_sha256", lambda *args: pytest.fail("hashed again"))
        again = copy.deepcopy(model)
        assert stored_weights.load_or_quantize(again, path, "tiny", "w4a8") is None
    assert isinstance(again.model.layers[0].mlp.down_proj, Q4Linear)
    ids = torch.tensor([list(range(3, 30))])
    assert torch.equal(first(ids).logits, again(ids).logits)


def test_storing_weights_deletes_their_older_formats_and_nothing_else(tmp_path, tokenizer, kernel):
    path = stored_weights.stored_weights_path("ab" * 32, "float32", "w4a8")
    path = tmp_path / path.name  # ...-float32-w4a8-v<current>.safetensors
    stem = path.name.rpartition("-v")[0]
    older = [tmp_path / f"{stem}-v{n}.safetensors{suffix}" for n in (1, 3) for suffix in ("", ".json", ".verified")]
    kept = [
        tmp_path / name
        for name in (
            f"{stem}-fast-v3.safetensors",
            f"{'cd' * 8}-float32-w4a8-v3.safetensors",
            f"{stem.replace('float32', 'bfloat16')}-v3.safetensors",
            "notes.txt",
        )
    ]
    for file in older + kept:
        file.write_bytes(b"x")
    model = build_model(len(tokenizer), seed=1, layers=1, hidden=128)
    assert stored_weights.load_or_quantize(model, path, "tiny", "w4a8") is None
    assert path.exists() and stored_weights._meta_path(path).exists()
    assert not any(file.exists() for file in older)
    assert all(file.exists() for file in kept)
    (tmp_path / "plain-v1.safetensors").write_bytes(b"x")
    assert stored_weights.remove_older_formats(tmp_path / "plain.safetensors") == []  # no version: no entry


def test_layers_reading_one_input_give_bitwise_their_own_products_in_one_call(kernel, tokenizer, monkeypatch):
    from specchat.quant import w4a8
    from specchat.runtime import lean

    model = build_model(len(tokenizer), seed=2, layers=1, hidden=256)
    quantize_w4a8(model, None, kernel)
    attention = model.model.layers[0].self_attn
    layers = [attention.q_proj, attention.k_proj, attention.v_proj]
    assert all(layer.group is not None and layer.group[0] is layers[0].group[0] for layer in layers)
    x = torch.randn(1, 5, 256)
    alone = [layer(x) for layer in layers]  # each layer's own kernel call on its view of the fused rows
    calls = []
    monkeypatch.setattr(
        w4a8.Q4Group,
        "products",
        lambda self, rows: (
            calls.append(1) or list(w4a8.run_kernel(self.product, rows, self.fused).split(self.widths, dim=1))
        ),
    )
    together = lean.same_input(layers, x)
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(alone, together))
    mlp = model.model.layers[0].mlp
    assert mlp.gate_proj.group[0] is mlp.up_proj.group[0] and mlp.down_proj.group is None


@pytest.mark.parametrize("gamma", [4, AUTO])
def test_greedy_speculative_equals_target_only_on_the_lean_forward_with_w4a8(tokenizer, kernel, gamma):
    from specchat.runtime.lean import attach_lean

    target = build_model(len(tokenizer), seed=1, layers=3, hidden=256)
    drafter = noisy_head_copy(target)
    target, drafter = w4a8_model(target, kernel, torch.float32), w4a8_model(drafter, kernel, torch.float32)
    assert attach_lean(target) == "" and attach_lean(drafter) == ""  # "": the lean forward runs
    assert_greedy_spec_is_target_only(target, drafter, tokenizer, "def reverse(lst):", gamma)


def test_the_kernel_refuses_weights_that_do_not_match_in_one_line(kernel):
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(8, 256)))
    x = torch.randn(2, 256)
    qs, sc, m, d, dmin = tiles.tensors()
    with pytest.raises(RuntimeError, match="sc must be"):
        kernel.q4_linear(x, qs, sc[:, :4].contiguous(), m, d, dmin)
    with pytest.raises(RuntimeError, match="m must be"):
        kernel.q4_linear(x, qs, sc, m[:, :1].contiguous(), d, dmin)
    with pytest.raises(RuntimeError, match="x is 128 wide; the weights take 256"):
        kernel.q4_linear(torch.randn(2, 128), *tiles.tensors())
    with pytest.raises(RuntimeError, match="float32"):
        kernel.q4_linear(x.double(), *tiles.tensors())
    with pytest.raises(RuntimeError, match="d and dmin must be contiguous float16"):
        kernel.q4_linear(x, qs, sc, m, d.float(), dmin.float())
    with pytest.raises(RuntimeError, match="16-row tiles"):
        kernel.q4_linear(x, qs.flatten(1), sc, m, d, dmin)
    with pytest.raises(RuntimeError, match="outs must fall in the last tile"):
        kernel.q4_linear(x, *tiles.tensors(), 17)
    with pytest.raises(RuntimeError, match="runs on the CPU only"):
        kernel.q4_linear(x.to("meta"), *tiles.tensors())


def test_the_compiled_layers_refuse_a_negative_start_and_a_wrong_width_in_one_line(kernel, tokenizer):
    from specchat.runtime.lean import LeanForward

    model = build_model(len(tokenizer), seed=2, layers=1, hidden=128)
    quantize_w4a8(model, None, kernel)
    native = LeanForward(model, kernel.LeanLayers).native_loop()
    empty = [torch.zeros(2, 8, 64) for _ in range(len(native))]  # [kv_heads, capacity, head_dim]
    table = torch.zeros(1, 64)
    with pytest.raises(RuntimeError, match="start must be >= 0, not -1"):
        native.forward(torch.zeros(1, 1, 128), empty, empty, table, table, -1)
    with pytest.raises(RuntimeError, match="hidden is 64 wide; the layers take 128"):
        native.forward(torch.zeros(1, 1, 64), empty, empty, table, table, 0)


def test_a_nan_or_an_infinity_in_a_row_makes_that_rows_outputs_nan_and_no_other(kernel):
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(32, 256)))
    x = torch.randn(3, 256)
    clean = run_kernel(kernel.q4_linear, x, tiles)
    x[0, 5], x[2, 200] = float("nan"), float("inf")
    out = run_kernel(kernel.q4_linear, x, tiles)
    assert out[0].isnan().all() and out[2].isnan().all()
    assert torch.equal(out[1], clean[1])


def test_each_version_of_the_kernel_source_builds_into_a_folder_of_its_own(monkeypatch):
    import torch as torch_module

    from specchat.kernels import build as kernels

    first = kernels.q4_build_dir()
    assert first.name.startswith("q4-") and first.parent.name == "kernels"
    for name, value in [("BASE_FLAGS", [*kernels.BASE_FLAGS, "-DOTHER"]), ("compiler_version", lambda: "other 1.0")]:
        with monkeypatch.context() as patch:
            patch.setattr(kernels, name, value)
            assert kernels.q4_build_dir() != first
    with monkeypatch.context() as patch:
        patch.setattr(torch_module, "__version__", "0.0.1")
        assert kernels.q4_build_dir() != first
    assert kernels.q4_build_dir() == first


def test_layers_of_one_group_blocks_fuse_whether_or_not_they_leave_out_their_dmin(kernel):
    """A file's q as Q4_0 (no scales, no dmin held) beside k as Q4_1 (its own dmin): fused whole, with their products."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from specchat.loading.gguf.blocks import decode_group_type
    from specchat.quant.w4a8 import Q4Group

    torch.manual_seed(3)
    tiles = [
        Q4Tiles.from_block(
            decode_group_type(
                kind, torch.from_numpy(quantize((torch.randn(rows, 256) * 0.1).numpy(), GGMLQuantizationType[kind]))
            )
        )
        for kind, rows in (("Q4_0", 64), ("Q4_1", 32), ("Q4_0", 16))
    ]
    assert [t.dmin.shape[2] for t in tiles] == [0, 16, 0] and all(t.sc.shape[2] == 0 for t in tiles)
    layers = [Q4Linear(t, None, kernel.q4_linear) for t in tiles]
    x = torch.randn(3, 256)
    alone = [layer(x) for layer in layers]
    group = Q4Group(layers)
    assert group.fused.sc.shape[2] == 0 and group.fused.dmin.shape[2] == 16  # dmin held for all, d where it is d
    assert all(torch.equal(a, b) for a, b in zip(alone, group.products(x), strict=True))
    assert all(torch.equal(a, layer(x)) for a, layer in zip(alone, layers, strict=True))


@pytest.mark.parametrize("bits", [4, 6])
def test_levels_are_tiled_from_their_bytes_as_from_the_levels(bits):
    from specchat.quant import q4_tiles

    generator = torch.Generator().manual_seed(bits)
    levels = torch.randint(0, 2**bits, (37, 12, 32), dtype=torch.uint8, generator=generator)
    tiles = -(-37 // 16)
    packed = LEVEL_BITS[bits][0](levels)
    from_bytes = {4: q4_tiles._tile_packed_4bit, 6: q4_tiles._tile_packed_6bit}[bits]
    assert torch.equal(from_bytes(packed, tiles), q4_tiles._tile_levels(q4_tiles._tile(levels, tiles), bits))


def test_a_block_made_from_chunks_of_rows_is_the_blocks_concatenated():
    from specchat.quant.q4_block import rows_in_place

    torch.manual_seed(6)
    parts = [Q4Block.quantize(torch.randn(rows, 256) * 0.1, 6) for rows in (16, 32, 5)]
    whole = Q4Block.from_chunks(53, iter(parts))
    concatenated = (torch.cat(fields) for fields in zip(*(part.tensors() for part in parts)))
    assert all(torch.equal(a, b) for a, b in zip(whole.tensors(), concatenated, strict=True))
    assert Q4Block.from_chunks(16, iter(parts[:1])).qs is parts[0].qs  # one chunk of all the rows: itself
    with pytest.raises(ValueError, match="the chunks hold 48 rows, not 53"):
        rows_in_place(53, (p.tensors() for p in parts[:2]))
