"""The w4a8 kernel's code paths (kernels/q4/q4_path_*.cpp), chosen at run time from what the CPU has: every
path gives bitwise the portable path's products, a row's result never depends on its batch, and the
layer loop and the bundled pair's greedy tokens are the same on every path. A path this CPU lacks is
skipped with the instruction set it needs."""

from __future__ import annotations

import contextlib

import pytest
import torch
from tiny_models import build_model

from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import quantize_w4a8, run_kernel

PATHS = {
    "portable": "",
    "avx2": "AVX2 and FMA",
    "avx-vnni": "AVX-VNNI",
    "avx512-vnni": "AVX-512 F/BW/VL/VNNI",
    "amx": "AMX-INT8, AVX-512 VNNI and the OS's leave to use the tiles",
}


@contextlib.contextmanager
def on_path(kernel, name: str):
    """The kernel's products on path `name` inside the block; the path before it afterwards."""
    before = kernel.kernel_path()
    kernel.set_kernel_path(name)
    try:
        yield
    finally:
        kernel.set_kernel_path(before)


def path_or_skip(kernel, name: str) -> str:
    if name not in kernel.kernel_paths():
        pytest.skip(f"the {name} path needs {PATHS[name]}, which this CPU lacks")
    return name


def products(kernel, name: str, x: torch.Tensor, tiles: Q4Tiles) -> torch.Tensor:
    with on_path(kernel, name):
        return run_kernel(kernel.q4_linear, x, tiles)


def test_the_fastest_path_this_cpu_has_runs_and_the_portable_one_is_always_there(kernel):
    available = kernel.kernel_paths()
    assert available[-1] == "portable" and kernel.kernel_path() == available[0]
    assert list(available) == [name for name in PATHS if name in available][::-1]
    with pytest.raises(
        RuntimeError, match="unknown kernel path fastest .known: amx, avx512-vnni, avx-vnni, avx2, portable"
    ):
        kernel.set_kernel_path("fastest")
    missing = [name for name in PATHS if name not in available]
    for name in missing:
        with pytest.raises(RuntimeError, match=f"needs {PATHS[name]}, which this CPU lacks"):
            kernel.set_kernel_path(name)
    assert kernel.kernel_path() == available[0]


@pytest.mark.parametrize("path", [name for name in PATHS if name != "portable"])
@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("outs, width", [(200, 640), (48, 1536), (33, 192), (16, 64), (7, 256)])
def test_every_path_gives_the_portable_paths_bits(kernel, path, bits, outs, width):
    path_or_skip(kernel, path)
    torch.manual_seed(outs + width + bits)
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(outs, width) * 0.1, bits))
    x = torch.randn(64, width)
    x[:, 3] *= 30  # an outlier channel
    # 1-17: one pass or two of the VNNI rows; 31 and 32: the last without AMX tiles, the first with; 53, 64: pairs
    # of tiles, one tile, the rows left over
    for rows in [*range(1, 18), 31, 32, 53, 64]:
        portable = products(kernel, "portable", x[:rows], tiles)
        assert portable.shape == (rows, outs)
        assert torch.equal(products(kernel, path, x[:rows], tiles), portable), f"{rows} rows"


GROUP_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]  # a GGUF's types of one float16 scale a 32-group


def group_type_tiles(kind: str, outs: int, width: int, seed: int) -> Q4Tiles:
    """gguf-py's own `kind` blocks of random weights, as the kernel holds them: blocks of one 32-group."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from specchat.loading.gguf.blocks import decode_group_type

    weight = torch.randn(outs, width, generator=torch.Generator().manual_seed(seed)) * 0.1
    weight[0, :32] *= -30  # a group of large values: Q8_0's levels near 0 and 255, Q4_0's d negative
    raw = quantize(weight.numpy(), GGMLQuantizationType[kind])
    return Q4Tiles.from_block(decode_group_type(kind, torch.from_numpy(raw)))


HALVES_TYPES = ["Q6_K", "IQ4_XS", "IQ4_NL"]  # a signed scale per 16 inputs (Q4Block.halves), or IQ4's table


def halves_tiles(kind: str, outs: int, width: int, seed: int) -> Q4Tiles:
    """Random `kind` blocks (both signs of the scales, levels over their whole range) as the kernel holds them."""
    from model_files import random_blocks

    from specchat.loading.gguf.blocks import AS_STORED

    block = AS_STORED[kind][1](torch.from_numpy(random_blocks(kind, outs, width, seed=seed)))
    assert block.table == kind.startswith("IQ4") and block.halves == (kind != "IQ4_NL")
    assert kind == "IQ4_NL" or int(block.sc.min()) < 0 < int(block.sc.max())
    return Q4Tiles.from_block(block)


def stored_tiles(kind: str, outs: int, width: int, seed: int) -> Q4Tiles:
    return (group_type_tiles if kind in GROUP_TYPES else halves_tiles)(kind, outs, width, seed)


STORED_SHAPES = [(200, 640), (33, 192), (16, 64)]  # blocks of one group: any width; 256-blocks: multiples of 256
STORED_CASES = [(kind, *shape) for kind in GROUP_TYPES + ["IQ4_NL"] for shape in STORED_SHAPES]
STORED_CASES += [(kind, *shape) for kind in ["Q6_K", "IQ4_XS"] for shape in [(200, 512), (33, 256), (16, 768)]]


@pytest.mark.parametrize("path", [name for name in PATHS if name != "portable"])
@pytest.mark.parametrize("kind, outs, width", STORED_CASES)
def test_every_path_gives_the_portable_paths_bits_on_each_type_as_stored(kernel, path, kind, outs, width):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL: a float16 d (and dmin) a 32-group, x quantized per 32 inputs; Q8_0's
    8-bit levels reach 255 (the AVX2 path's low-7-bits-and-top-bit split), IQ4's table levels 241. Q6_K (6-bit
    levels) and IQ4_XS (table indices): each 16 inputs with a signed scale and offset of their own."""
    path_or_skip(kernel, path)
    tiles = stored_tiles(kind, outs, width, seed=outs + width)
    x = torch.randn(64, width)
    x[:, 3] *= 30  # an outlier channel: only its own block's activations lose precision
    for rows in [*range(1, 18), 31, 32, 53, 64]:
        portable = products(kernel, "portable", x[:rows], tiles)
        assert torch.equal(products(kernel, path, x[:rows], tiles), portable), f"{rows} rows"


@pytest.mark.parametrize(
    "kind, sc_left_out, dmin_left_out", [("Q4_0", True, True), ("Q8_0", True, True), ("Q4_1", True, False)]
)
def test_blocks_of_one_group_leave_out_unit_scales_and_a_dmin_equal_to_d_and_give_the_same_bits(
    kernel, kind, sc_left_out, dmin_left_out
):
    """Q4_0's and Q8_0's tiles hold neither their scales (all 1) nor dmin (d); Q4_1's hold its own dmin. Every path
    gives the bits of the same tiles held whole, and the tiles give back the block they were made from."""
    tiles = group_type_tiles(kind, 200, 640, seed=4)
    assert (tiles.sc.shape[2] == 0) == sc_left_out and (tiles.dmin.shape[2] == 0) == dmin_left_out
    assert tiles.sc.shape[:2] == (13, 20) and tiles.dmin.shape[:2] == tiles.d.shape[:2]
    whole = Q4Tiles(*tiles.full_tensors(), outs=tiles.outs)
    assert whole.sc.shape[2] == whole.dmin.shape[2] == 16 and torch.equal(whole.dequantize(), tiles.dequantize())
    assert all(torch.equal(a, b) for a, b in zip(Q4Tiles.from_block(tiles.to_block()).tensors(), tiles.tensors()))
    x = torch.randn(17, 640)
    for path in kernel.kernel_paths():
        for rows in (1, 2, 5, 9, 17):
            assert torch.equal(
                products(kernel, path, x[:rows], tiles), products(kernel, "portable", x[:rows], whole)
            ), (path, rows)


@pytest.mark.parametrize("dmin_is_d", [False, True])
def test_blocks_of_one_group_with_scales_of_their_own_give_the_portable_paths_bits_on_every_path(kernel, dmin_is_d):
    """No GGUF type makes them, but the layout allows them: blocks of one group with scales of their own (the AVX-512
    path's general code, the AVX2 path's code for blocks of one group), with dmin their own or d's."""
    tiles = group_type_tiles("Q4_1", 200, 640, seed=5)
    block = tiles.to_block()
    sc = torch.randint(1, 64, block.sc.shape, generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    scaled = Q4Tiles.from_block(Q4Block(block.qs, sc, block.m, block.d, block.d if dmin_is_d else block.dmin))
    assert scaled.sc.shape[2] == 16 and (scaled.dmin.shape[2] == 0) == dmin_is_d
    x = torch.randn(17, 640)
    x[:, 3] *= 30
    for path in kernel.kernel_paths():
        for rows in (1, 3, 8, 17):
            assert torch.equal(
                products(kernel, path, x[:rows], scaled), products(kernel, "portable", x[:rows], scaled)
            ), (path, rows)
    y = torch.randn(5, 640, generator=torch.Generator().manual_seed(6))  # no outlier: only the rounding of y
    exact = y.double() @ scaled.dequantize().double().T
    assert (products(kernel, "portable", y, scaled).double() - exact).norm() < 0.01 * exact.norm()


def test_only_blocks_of_one_group_may_leave_out_their_scales(kernel):
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(32, 512) * 0.1, 4))
    qs, sc, m, d, dmin = tiles.tensors()
    with pytest.raises(RuntimeError, match="only blocks of one 32-group may leave out sc"):
        kernel.q4_linear(torch.randn(1, 512), qs, sc[..., :0].contiguous(), m, d, dmin, -1)
    assert torch.equal(  # dmin may be left out in any block: d stands for it
        kernel.q4_linear(torch.ones(1, 512), qs, sc, m, d, d[..., :0].contiguous(), -1),
        kernel.q4_linear(torch.ones(1, 512), qs, sc, m, d, d, -1),
    )


@pytest.mark.parametrize("kind", ["IQ4_NL", "IQ4_XS"])
def test_table_indices_give_on_every_path_the_bits_of_the_levels_they_stand_for(kernel, kind):
    """IQ4's 4-bit indices, looked up in the kernel, give the products of the same weights held as 8-bit levels."""
    from specchat.quant.q4_levels import LEVEL_BITS, unpacked_levels

    tiles = halves_tiles(kind, 48, 512, seed=3)
    block = tiles.to_block()
    levels = LEVEL_BITS[8][0](unpacked_levels(block.qs, 4).contiguous())
    as_levels = Q4Tiles.from_block(Q4Block(levels, block.sc, block.m, block.d, block.dmin))
    assert as_levels.bits == 8 and torch.equal(as_levels.dequantize(), tiles.dequantize())
    x = torch.randn(9, 512)
    for path in kernel.kernel_paths():
        assert torch.equal(products(kernel, path, x, tiles), products(kernel, path, x, as_levels)), path


@pytest.mark.parametrize("kind", GROUP_TYPES + HALVES_TYPES)
def test_each_type_as_stored_gives_the_files_weights_times_x_to_its_activations_rounding(kernel, kind):
    tiles = stored_tiles(kind, 48, 512, seed=9)
    if kind in GROUP_TYPES:
        assert tiles.bits == {"Q4": 4, "Q5": 6, "Q8": 8}[kind[:2]]
    x = torch.randn(5, 512)
    exact = x.double() @ tiles.dequantize().double().T
    rounded = x.view(5, -1, 512 // tiles.d.shape[1])  # x as the kernel quantizes it: int8 levels per row and block
    scale = rounded.abs().amax(dim=2, keepdim=True) / 127
    rounded = (torch.round(rounded / scale) * scale).view(5, 512)
    wanted = rounded.double() @ tiles.dequantize().double().T
    out = run_kernel(kernel.q4_linear, x, tiles).double()
    assert torch.allclose(out, wanted, rtol=1e-5, atol=1e-5 * wanted.abs().max().item())
    assert ((out - exact).norm() / exact.norm()) < 0.01


@pytest.mark.parametrize("path", [name for name in PATHS if name != "portable"])
def test_every_path_maps_activations_onto_levels_as_the_portable_path(kernel, path):
    """Each path quantizes x with its own code (q4_path_*.cpp): halfway values round to even on all
    of them, a row of zeros stays zero, and a NaN or an infinity makes its row NaN wherever it sits."""
    path_or_skip(kernel, path)
    torch.manual_seed(7)
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(48, 512) * 0.1, 4))
    halves = torch.randint(-127, 127, (6, 512)).float() + 0.5  # each x / scale lands halfway between levels
    halves[:, ::256] = 127.0  # so every block's amax is 127 and its scale exactly 1
    x = torch.cat([halves, torch.zeros(1, 512), torch.randn(3, 512)])
    x[-3, 300], x[-2, 5], x[-1, 511] = float("inf"), float("nan"), -float("inf")
    for rows in (1, 4, 7):  # halfway rows, then the row of zeros
        portable, other = (products(kernel, name, x[:rows], tiles) for name in ("portable", path))
        assert torch.equal(other, portable), f"{rows} rows"
    portable, other = (products(kernel, name, x, tiles) for name in ("portable", path))
    assert torch.equal(other[:7], portable[:7]) and portable[6].eq(0).all()
    assert portable[7:].isnan().all() and other[7:].isnan().all()


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_several_weights_in_one_call_give_each_weights_own_bits_side_by_side(kernel, rows):
    """q4_linear_parts (q/k/v, gate/up in the layer loop): x quantized once, one loop over every part's tiles."""
    torch.manual_seed(rows)
    parts = [
        Q4Tiles.from_block(Q4Block.quantize(torch.randn(outs, 512) * 0.1, bits))
        for outs, bits in [(64, 4), (16, 6), (48, 8), (32, 4)]
    ]
    x = torch.randn(rows, 512)
    x[-1, 7] = float("nan")  # a row with a NaN is NaN in every part, the others untouched
    together = kernel.q4_linear_parts(x, [list(p.tensors()) for p in parts])
    alone = torch.cat([kernel.q4_linear(x, *p.tensors()) for p in parts], dim=1)
    assert together.shape == (rows, 160) and torch.equal(together[:-1], alone[:-1])
    assert together[-1].isnan().all() and alone[-1].isnan().all()
    with pytest.raises(RuntimeError, match="x is 256 wide; the weights take 512"):
        kernel.q4_linear_parts(x[:, :256], [list(parts[0].tensors())])


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_the_tiles_shared_out_among_threads_give_one_threads_bits(kernel, threads):
    """Each thread takes its own share, then tiles from the back of the others' (tile_shares.h): every tile runs
    once, whichever thread runs it, with more threads than tiles too (one tile: 16 outputs)."""
    torch.manual_seed(threads)
    parts = [Q4Tiles.from_block(Q4Block.quantize(torch.randn(outs, 256) * 0.1, 4)) for outs in (16, 400, 96)]
    weights = [list(p.tensors()) for p in parts]
    x = torch.randn(3, 256)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [kernel.q4_linear_parts(x, [w]) for w in weights] + [kernel.q4_linear_parts(x, weights)]
        torch.set_num_threads(threads)
        for _ in range(20):  # which thread takes which tile changes from run to run
            shared = [kernel.q4_linear_parts(x, [w]) for w in weights] + [kernel.q4_linear_parts(x, weights)]
            assert all(torch.equal(a, s) for a, s in zip(alone, shared, strict=True))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("bits", [4, 6])
def test_on_every_path_a_row_gets_the_same_bits_alone_or_anywhere_in_a_batch(kernel, path, bits):
    path_or_skip(kernel, path)
    torch.manual_seed(bits)
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(96, 512) * 0.1, bits))
    row = torch.randn(1, 512)
    alone = products(kernel, path, row, tiles)[0]
    for rows in range(1, 14):
        for position in {0, rows // 2, rows - 1}:
            batch = torch.randn(rows, 512) * 2
            batch[position] = row[0]
            assert torch.equal(products(kernel, path, batch, tiles)[position], alone), (rows, position)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("bits, width", [(4, 1536), (6, 640), (8, 192)])
def test_a_long_prompts_rows_get_the_bits_each_row_gets_alone(kernel, path, bits, width):
    """A prompt's rows in one product (its blocks unpacked once for all rows) == each row on its own
    (unpacked in registers), for 7, 128 and 512 rows."""
    path_or_skip(kernel, path)
    torch.manual_seed(bits + width)
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(48, width) * 0.1, bits))
    x = torch.randn(512, width)
    x[:, 5] *= 30  # an outlier channel
    alone = torch.cat([products(kernel, path, x[r : r + 1], tiles) for r in range(512)])
    for rows in (7, 128, 512):
        assert torch.equal(products(kernel, path, x[:rows], tiles), alone[:rows]), f"{rows} rows"


def test_the_tiles_hold_the_weights_a_row_after_a_row_held(kernel):
    torch.manual_seed(5)
    for bits in (4, 6, 8):
        block = Q4Block.quantize(torch.randn(37, 384) * 0.1, bits)
        tiles = Q4Tiles.from_block(block)
        assert tiles.qs.shape == (3, 12, 16 * {4: 16, 6: 24, 8: 32}[bits]) and tiles.outs == 37
        assert all(torch.equal(a, b) for a, b in zip(tiles.to_block().tensors(), block.tensors()))
        index = torch.tensor([36, 0, 17, 5])
        assert torch.equal(tiles.rows(index).dequantize(), block.dequantize()[index])
        assert torch.equal(tiles.rows(slice(3, 20)).dequantize(), block.dequantize()[3:20])
        for whole in (slice(0, 32), slice(16, 37), slice(16, None)):  # runs of whole tiles: views, no unpacking
            part = tiles.rows(whole)
            assert part.qs.untyped_storage().data_ptr() == tiles.qs.untyped_storage().data_ptr()
            assert torch.equal(part.dequantize(), block.dequantize()[whole]), whole


@pytest.mark.parametrize("path", [name for name in PATHS if name != "portable"])
def test_the_compiled_decoder_layers_give_the_portable_paths_logits(kernel, tokenizer, path):
    from specchat.runtime.lean import LeanForward, LeanKVCache

    path_or_skip(kernel, path)
    model = build_model(len(tokenizer), seed=4, layers=2, hidden=256)
    quantize_w4a8(model, None, kernel)
    lean = LeanForward(model, kernel.LeanLayers)
    assert lean.native_reason == ""
    ids = torch.tensor([list(range(5, 45))])

    def logits(name: str) -> list[torch.Tensor]:
        cache = LeanKVCache(lean)
        with on_path(kernel, name):
            return [lean(cache, ids[:, :35], keep=35), lean(cache, ids[:, 35:40], keep=5)]

    assert all(torch.equal(a, b) for a, b in zip(logits(path), logits("portable")))


@pytest.mark.slow
def test_the_layer_loop_built_without_avx2_gives_the_avx2_builds_bits(kernel, tokenizer, tmp_path, monkeypatch):
    """The layer loop's plain-C++ float steps (simd.h without AVX2) round as its AVX2 ones do: a Llama, and Gemmas
    (GELU-tanh, soft-capped scores through simd's tanh, windows of 8, Gemma-3's second rotary table)."""
    from model_files import tiny_model

    from specchat.kernels import build as kernels
    from specchat.runtime.lean import LeanForward, LeanKVCache

    if "avx2" not in kernel.kernel_paths():
        pytest.skip("the AVX2 build needs AVX2 and FMA, which this CPU lacks")
    monkeypatch.setattr(kernels, "_has_avx2", lambda: False)
    plain = kernels.build_kernel(str(tmp_path / "plain"), name="specchat_q4_plain")
    assert "-mavx2" not in kernels.kernel_flags()
    gemma = {
        "hidden_size": 256,
        "intermediate_size": 512,
        "head_dim": 64,
        "sliding_window": 8,
        "initializer_range": 0.2,
    }
    models = [
        build_model(len(tokenizer), seed=6, layers=2, hidden=256),
        tiny_model("gemma2", len(tokenizer), seed=6, attn_logit_softcapping=5.0, **gemma),
        tiny_model("gemma3", len(tokenizer), seed=6, num_hidden_layers=6, **gemma),  # 5 local layers, then a global
    ]
    ids = torch.tensor([list(range(5, 30))])
    for model in models:
        quantize_w4a8(model, None, kernel)
        outputs = []
        for module in (kernel, plain):
            lean = LeanForward(model, module.LeanLayers)
            assert lean.native_reason == ""
            with on_path(kernel, "portable"), on_path(plain, "portable"):
                outputs.append(lean(LeanKVCache(lean), ids, keep=25))
        assert torch.equal(*outputs), model.config.model_type


@pytest.mark.slow
def test_the_bundled_pair_gives_the_same_tokens_on_the_portable_path_and_stays_exact(kernel):
    """The default config's greedy reply, target-only on the fastest path, and target-only and
    speculative with the portable path forced: the same token ids."""
    from model_files import greedy_reply

    from specchat.loading.models import load_pair
    from specchat.settings import load_config

    pair = load_pair(load_config(None, []))
    messages = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
    ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    fastest = greedy_reply(pair, "target", ids, n=12)
    with on_path(kernel, "portable"):
        assert greedy_reply(pair, "target", ids, n=12) == fastest
        assert greedy_reply(pair, "spec", ids, n=12, gamma=4) == fastest
