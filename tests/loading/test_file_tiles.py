"""A user's GGUF's layers of the types the kernel tiles from the file (Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
Q8_0) are tiled
from it at each start (loading/file_tiles.py): the stored weights hold a marker for them, not a second copy; the tiles
are bit for bit those of the first start; a file that no longer holds the blocks a marker names gets its stored
weights rebuilt; a bundled model's layers stay stored."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from model_files import greedy_reply, random_blocks, typed_pair_files
from test_gguf_architectures import cache, on_the_cpu, tok
from test_gguf_types import prompt_ids

from specchat.loading import file_tiles, stored_weights
from specchat.loading.gguf.blocks import AS_STORED
from specchat.loading.models import load_pair
from specchat.loading.tensor_file import read_tensors
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import Q4Linear
from specchat.settings import load_config

FIXTURES = (cache, on_the_cpu, tok)  # test_gguf_architectures' autouse fixtures, on here too

pytestmark = pytest.mark.usefixtures("one_thread")


def q4_k_bytes(rows: int, blocks: int, seed: int, same_min: bool = False) -> torch.Tensor:
    """Random Q4_K blocks with small finite fp16 d and dmin (dmin equal to d where `same_min`)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows, blocks, 144), dtype=torch.uint8, generator=g)
    d = (torch.rand(rows, blocks, 1, generator=g) / 64).half().view(torch.uint8)
    raw[..., 0:2] = d
    raw[..., 2:4] = d if same_min else (torch.rand(rows, blocks, 1, generator=g) / 64).half().view(torch.uint8)
    return raw.reshape(rows, -1)


def blocks_of(kind: str, rows: int, blocks: int, seed: int, same_min: bool) -> torch.Tensor:
    """Random blocks of `kind` covering blocks·256 inputs a row; `same_min`: dmin made d (Q4_K), d 0 (Q6_K: dmin is
    32·d), min −d (Q4_1)."""
    import gguf

    if kind == "Q4_K":
        return q4_k_bytes(rows, blocks, seed, same_min)
    width = blocks * 256
    if kind in ("Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"):
        raw = torch.from_numpy(random_blocks(kind, rows, width, seed=seed)).reshape(rows, -1)
    else:  # gguf-py's own quantization of random weights
        weights = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)).numpy() / 10
        raw = torch.from_numpy(gguf.quants.quantize(weights, gguf.GGMLQuantizationType[kind])).reshape(rows, -1)
    if same_min and kind == "Q5_K":
        raw.view(rows, -1, 176)[..., 2:4] = raw.view(rows, -1, 176)[..., 0:2]
    if same_min and kind == "Q6_K":
        raw.view(rows, -1, 210)[..., 208:210] = 0
    if same_min and kind in ("Q4_1", "Q5_1"):
        groups = raw.view(rows, -1, 20 if kind == "Q4_1" else 24)
        groups[..., 2:4] = (groups[..., 0:2].contiguous().view(torch.float16) * -1).view(torch.uint8)
    return raw


def decoded(kind: str, raw: torch.Tensor) -> Q4Tiles:
    return Q4Tiles.from_block(AS_STORED[kind][1](raw))


KINDS = ["Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q8_0"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows, blocks, same_min", [(37, 2, False), (16, 1, True), (100, 3, False), (1, 1, False)])
def test_the_compiled_tiling_gives_the_tiles_of_the_decoded_blocks_bit_for_bit(kernel, kind, rows, blocks, same_min):
    raw = blocks_of(kind, rows, blocks, seed=rows, same_min=same_min)
    wanted = decoded(kind, raw)
    tiles = file_tiles.tile_blocks(kind, raw)
    assert tiles.outs == wanted.outs and tiles.dmin.shape == wanted.dmin.shape  # dmin left out where it is d
    for got, expected in zip(tiles.tensors(), wanted.tensors()):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_the_compiled_tiling_refuses_fields_of_another_shape(kernel):
    raw = q4_k_bytes(20, 1, seed=1)
    shapes = file_tiles.tile_shapes("Q4_K", 16, 256).items()
    fields = {name: torch.empty(shape, dtype=dtype) for name, (dtype, shape) in shapes}
    with pytest.raises(ValueError, match="tile_q4_k: qs must be a contiguous tensor of the tiles' shape"):
        file_tiles.tile_blocks("Q4_K", raw, fields)
    with pytest.raises(ValueError, match="whole Q4_K blocks"):
        file_tiles.tile_blocks("Q4_K", raw[:, :100])
    with pytest.raises(ValueError, match="tile_group_blocks: dmin must be a contiguous tensor"):
        q4_0 = blocks_of("Q4_0", 16, 1, seed=2, same_min=False)
        fields = file_tiles.tile_shapes("Q4_1", 16, 256).items()
        file_tiles.tile_blocks("Q4_0", q4_0, {name: torch.empty(shape, dtype=dtype) for name, (dtype, shape) in fields})
    q6 = blocks_of("Q6_K", 16, 1, seed=2, same_min=False)
    fields = {
        name: torch.empty(shape, dtype=dtype)
        for name, (dtype, shape) in file_tiles.tile_shapes("Q6_K", 16, 256).items()
    }
    fields["sc"] = fields["sc"].view(torch.uint8)  # Q6_K's scales are signed
    with pytest.raises(ValueError, match="tile_q6_k: sc must be a contiguous tensor"):
        file_tiles.tile_blocks("Q6_K", q6, fields)


def stored_file():
    [path] = [p for p in (stored_weights.cache_dir() / "quantized").glob("*-w4a8-v*.safetensors")]
    return path


def q4_tiles(pair) -> dict[str, Q4Tiles]:
    return {name: layer.tiles for name, layer in pair.target.named_modules() if isinstance(layer, Q4Linear)}


@pytest.mark.parametrize(
    "kind, architecture",
    [("Q4_K", "qwen2"), ("Q4_K", "llama"), ("Q6_K", "qwen2"), ("Q4_0", "qwen2"), ("Q8_0", "llama"), ("IQ4_NL", "qwen2")]
    + [("IQ4_XS", "qwen2"), ("Q4_1", "qwen2"), ("Q5_K", "qwen2"), ("Q5_0", "qwen2"), ("Q5_1", "llama")],
)  # llama's q and k rows are reordered (their markers hold the order)
def test_a_files_q4_k_and_q6_k_layers_are_a_marker_in_the_stored_weights_and_tiled_alike_at_the_next_start(
    tmp_path, tok, kernel, kind, architecture, monkeypatch
):
    """Each start's tiles are those of the slow decoding (gguf/blocks.py's streamed_blocks), bit for bit, and those of
    a load that stores every layer (a bundled model's way): no start makes them the slow way first."""
    target, drafter = typed_pair_files(tmp_path, tok, kind, architecture)
    config = load_config(None, [f"target.source={target}", f"drafter.source={drafter}"])
    reference = reference_tiles(target)
    bundled = q4_tiles(stored_as_a_bundled_model(config, tmp_path / "reference", monkeypatch))
    first = load_pair(config)
    stored = read_tensors(stored_file())
    markers = [name for name in stored if ".from_file_" in name]
    held = {name.rsplit(".", 1)[0] for name in stored if ".from_file_" not in name}
    assert len(markers) == 15 and not held  # 7 layers a block, 2 blocks, the head
    assert all(name.endswith(f".from_file_{kind}") for name in markers)
    orders = {name for name in markers if stored[name].dim() == 1}  # llama's q and k: 2 blocks
    assert len(orders) == (4 if architecture == "llama" else 0) and all(
        ".q_proj." in n or ".k_proj." in n for n in orders
    )
    assert all(int(stored[name]) == GGMLQuantizationType[kind] for name in markers if name not in orders)
    again = load_pair(config)  # tiled from the file this time
    before, after = q4_tiles(first), q4_tiles(again)
    assert before.keys() == after.keys() == reference.keys() and len(after) == 15
    for name, tiles in after.items():
        assert all(torch.equal(a, b) for a, b in zip(tiles.tensors(), before[name].tensors())), name
        assert all(torch.equal(a, b) for a, b in zip(tiles.tensors(), reference[name].tensors())), name
        assert all(torch.equal(a, b) for a, b in zip(tiles.tensors(), bundled[name].tensors())), name
    ids = prompt_ids(tok)
    assert greedy_reply(again, "spec", ids) == greedy_reply(again, "target", ids) == greedy_reply(first, "target", ids)


def reference_tiles(gguf) -> dict[str, Q4Tiles]:
    """The file's layers as the slow decoding makes them (gguf/blocks.py's streamed_blocks, w4a8's finer bits)."""
    from specchat.loading.gguf.blocks import streamed_blocks
    from specchat.loading.gguf.config import file_config
    from specchat.loading.gguf.slim import empty_model
    from specchat.quant.w4a8 import FINER_BITS

    model = empty_model(file_config(gguf))
    return {name: Q4Tiles.from_block(block) for name, block in streamed_blocks(gguf, model, FINER_BITS)}


def stored_as_a_bundled_model(config, cache, monkeypatch):
    """The pair loaded with every layer stored (as for a bundled model, whose assembled file is let go), in a cache of
    its own."""
    real = stored_weights.load_or_quantize
    with monkeypatch.context() as patch:
        patch.setenv("SPECCHAT_CACHE", str(cache))
        patch.setattr(
            stored_weights, "load_or_quantize", lambda *args, **kw: real(*args, **{**kw, "file_stays": False})
        )
        return load_pair(config)


def test_a_files_layers_whose_scales_are_past_float16_or_that_the_mode_requantizes_are_not_tiled_from_it(
    tmp_path, tok, kernel
):
    """Q6_K with 32·d past float16's range (the reference requantizes it: ScaleOverflow), and in w4a8-fast (every
    layer 4-bit) the finer types, are stored; the rest of the file's layers are tiled from it."""
    from specchat.loading.gguf.config import file_config
    from specchat.loading.gguf.slim import empty_model

    target, _ = typed_pair_files(tmp_path, tok, "Q6_K", "qwen2")
    model = empty_model(file_config(target))
    tileable = file_tiles.tileable_layers(target, model, finer_bits=6)
    assert len(tileable) == 15 and all(kind == "Q6_K" for kind, _ in tileable.values())
    assert file_tiles.tileable_layers(target, model, finer_bits=4) == {}  # w4a8-fast requantizes Q6_K
    raw = blocks_of("Q6_K", 3, 1, seed=4, same_min=False)
    assert file_tiles.finite_tiles("Q6_K", raw)
    raw.view(3, 1, 210)[1, 0, 208:210] = torch.tensor([4096.0]).half().view(torch.uint8)  # 32·4096 > 65504
    assert not file_tiles.finite_tiles("Q6_K", raw)
    q4_0 = blocks_of("Q4_0", 3, 1, seed=4, same_min=False)
    q4_0.view(3, -1, 18)[2, 0, 0:2] = torch.tensor([float("nan")]).half().view(torch.uint8)
    assert not file_tiles.finite_tiles("Q4_0", q4_0)


def test_a_file_that_no_longer_holds_the_marked_blocks_has_its_stored_weights_rebuilt(
    tmp_path, tok, kernel, monkeypatch
):
    target, drafter = typed_pair_files(tmp_path, tok, "Q4_K", "qwen2")
    config = load_config(None, [f"target.source={target}", f"drafter.source={drafter}"])
    wanted = q4_tiles(load_pair(config))
    monkeypatch.setattr(file_tiles, "file_tensors", lambda gguf: {})  # as if the file's tensors were gone
    lines = []
    pair = load_pair(config, lambda message, fraction: lines.append(message))
    said = [line for line in lines if "rebuilt the stored weights" in line]
    assert len(said) == 1 and "no longer holds the Q4_K blocks of" in said[0]
    assert all(
        torch.equal(a, b) for name, t in q4_tiles(pair).items() for a, b in zip(t.tensors(), wanted[name].tensors())
    )
    assert not any(".from_file_" in name for name in read_tensors(stored_file()))  # none could be verified


def test_without_the_file_at_hand_every_layer_is_stored(tmp_path, tok, kernel, monkeypatch):
    target, drafter = typed_pair_files(tmp_path, tok, "Q4_K", "qwen2")
    real = stored_weights.load_or_quantize
    monkeypatch.setattr(
        stored_weights, "load_or_quantize", lambda *args, **kw: real(*args, **{**kw, "file_stays": False})
    )  # as for a bundled model, whose assembled file is let go
    load_pair(load_config(None, [f"target.source={target}", f"drafter.source={drafter}"]))
    stored = read_tensors(stored_file())
    assert not any(".from_file_" in name for name in stored) and len({n.rsplit(".", 1)[0] for n in stored}) == 15


def test_a_layer_is_marked_only_where_every_chunk_and_the_way_dmin_is_held_match(kernel, monkeypatch):
    monkeypatch.setattr(file_tiles, "QUANTIZE_ROWS", 32)  # 100 rows: four chunks
    raw = q4_k_bytes(100, 2, seed=5)
    tiles = decoded("Q4_K", raw)
    assert file_tiles.same_tiles("Q4_K", raw, tiles)
    changed = Q4Tiles(*(t.clone() for t in tiles.tensors()), outs=tiles.outs)
    changed.qs[5, 1, 7] ^= 1  # one bit of row 80's tile, in the third chunk
    assert not file_tiles.same_tiles("Q4_K", raw, changed)
    same_min = q4_k_bytes(100, 2, seed=5, same_min=True)
    left_out = decoded("Q4_K", same_min)
    assert left_out.dmin.shape[2] == 0 and file_tiles.same_tiles("Q4_K", same_min, left_out)
    held = Q4Tiles(*left_out.full_tensors(), outs=100)  # the same weights with dmin held: not as tile_blocks makes it
    assert not file_tiles.same_tiles("Q4_K", same_min, held)


def test_a_markers_row_order_must_be_each_of_the_layers_rows_once():
    assert file_tiles.checked_order(torch.tensor(12), 4, "q") is None  # a type code: no order
    assert torch.equal(file_tiles.checked_order(torch.tensor([2, 0, 3, 1]), 4, "q"), torch.tensor([2, 0, 3, 1]))
    for bad in (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1, 3]), torch.tensor([0, 1, 2, 9]), torch.zeros(4)):
        with pytest.raises(file_tiles.FileChanged, match="its row order for q is not one of the layer's 4 rows"):
            file_tiles.checked_order(bad, 4, "q")


@pytest.mark.parametrize("kind, bytes_, at, factor", [("Q6_K", 210, 208, 32), ("IQ4_XS", 136, 0, 128)])
def test_q6_k_and_iq4_xs_dmin_is_32_and_128_d_exactly_for_subnormal_normal_and_large_d(
    kernel, kind, bytes_, at, factor
):
    d = torch.tensor([0.0, 1e-7, 3e-6, 6e-5, 1e-4, 0.5, -0.75, 100.0, 500.0]).half()  # 128 · 500 < 65504
    raw = blocks_of(kind, len(d), 1, seed=3, same_min=False)
    raw.view(len(d), 1, bytes_)[..., at : at + 2] = d.view(torch.uint8).view(len(d), 1, 2)
    tiles, wanted = file_tiles.tile_blocks(kind, raw), decoded(kind, raw)
    assert all(torch.equal(got, expected) for got, expected in zip(tiles.tensors(), wanted.tensors()))
    assert torch.equal(tiles.full_dmin.transpose(1, 2).flatten(0, 1)[: len(d), 0].float(), d.float() * factor)
