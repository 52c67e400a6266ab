"""loading/tile_arena.py: stored w4a8 tiles read straight into one region, the layers that read one input side by
side, so their fused tiles are views, not copies; the same products as tiles read into fresh memory."""

from __future__ import annotations

import copy
import ctypes

import pytest
import torch
from tiny_models import build_model

from specchat import early_pages
from specchat.loading import huge_pages, stored_weights, tensor_file
from specchat.loading.tile_arena import placer, side_by_side_runs
from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import Q4Linear


def test_each_groups_fields_lie_side_by_side_and_unlike_ones_apart():
    entries = {
        "a.q.qs": (torch.uint8, [4, 2, 256]),
        "a.k.qs": (torch.uint8, [1, 2, 256]),
        "a.q.d": (torch.float16, [4, 1, 16]),
        "a.k.d": (torch.float16, [1, 2, 16]),  # another block width: not side by side
        "a.q.outs": (torch.int64, []),  # not a tile's tensor: read into fresh memory
        "b.qs": (torch.uint8, [3, 2, 256]),
    }
    runs = side_by_side_runs(entries, [["a.q", "a.k"]])
    assert runs == [["a.q.qs", "a.k.qs"], ["a.q.d"], ["a.k.d"], ["b.qs"]]
    placed = placer([["a.q", "a.k"]])(entries)
    assert set(placed) == {name for run in runs for name in run}
    q, k = placed["a.q.qs"], placed["a.k.qs"]
    assert q.data_ptr() + q.nbytes == k.data_ptr() and all(t.data_ptr() % 64 == 0 for t in placed.values())
    assert all(
        t.is_contiguous() and t.dtype == entries[n][0] and list(t.shape) == entries[n][1] for n, t in placed.items()
    )


def test_tiles_side_by_side_join_as_a_view_and_others_as_a_copy():
    torch.manual_seed(0)
    first, second = (Q4Tiles.from_block(Q4Block.quantize(torch.randn(rows, 256) * 0.1)) for rows in (32, 16))
    region = torch.empty(first.qs.nbytes + second.qs.nbytes, dtype=torch.uint8)
    side = [region[: first.qs.nbytes].view(first.qs.shape), region[first.qs.nbytes :].view(second.qs.shape)]
    side[0].copy_(first.qs)
    side[1].copy_(second.qs)
    apart = Q4Tiles.concat([first, second], outs=48)
    together = Q4Tiles.concat(
        [Q4Tiles(side[0], *first.tensors()[1:], outs=32), Q4Tiles(side[1], *second.tensors()[1:], outs=16)], outs=48
    )
    assert together.qs.data_ptr() == region.data_ptr() and together.qs.shape == (3, 8, 256)
    assert apart.qs.data_ptr() not in (first.qs.data_ptr(), second.qs.data_ptr())
    assert all(torch.equal(a, b) for a, b in zip(apart.tensors(), together.tensors(), strict=True))


def test_a_stored_models_fused_tiles_are_views_of_what_was_read_and_give_its_logits(
    tmp_path, tokenizer, kernel, monkeypatch
):
    model = build_model(len(tokenizer), seed=1, layers=2, hidden=128)
    path = tmp_path / "model-float32-w4a8.safetensors"
    first = copy.deepcopy(model)
    assert stored_weights.load_or_quantize(first, path, "tiny", "w4a8") is None
    fresh = copy.deepcopy(model)
    monkeypatch.setattr(tensor_file, "read_tensors", lambda path, place=None, read=tensor_file.read_tensors: read(path))
    assert stored_weights.load_or_quantize(fresh, path, "tiny", "w4a8") is None  # read as before: fused by copying
    monkeypatch.undo()
    again = copy.deepcopy(model)
    assert stored_weights.load_or_quantize(again, path, "tiny", "w4a8") is None
    for loaded, copied in ((again, False), (fresh, True)):
        attention = loaded.model.layers[0].self_attn
        group = attention.q_proj.group[0]
        assert group.copied == copied and isinstance(attention.q_proj, Q4Linear)
        assert (group.fused.qs.data_ptr() == attention.q_proj.tiles.qs.data_ptr()) and group.fused.qs.is_contiguous()
    region = again.model.layers[0].self_attn.q_proj.tiles.qs.untyped_storage().data_ptr()
    assert again.model.layers[1].mlp.down_proj.tiles.qs.untyped_storage().data_ptr() == region  # one region
    if huge_pages.huge_pages_offered():  # already in 2 MB pages: nothing left to move
        assert region in huge_pages.REGIONS and huge_pages.into_huge_pages(huge_pages.w4a8_tensors(again)) == 0
    ids = torch.tensor([list(range(3, 30))])
    assert torch.equal(first(ids).logits, again(ids).logits) and torch.equal(fresh(ids).logits, again(ids).logits)


@pytest.mark.skipif(not huge_pages.huge_pages_offered(), reason="this system offers no transparent huge pages")
def test_a_region_is_zeros_2mb_aligned_and_known_while_it_lives():
    import gc

    region = huge_pages.huge_page_region(3 << 20, touched=True)
    address = region.untyped_storage().data_ptr()
    assert region.data_ptr() % huge_pages.HUGE_PAGE == 0 and region.shape == (3 << 20,) and not region.any()
    assert address in huge_pages.REGIONS and huge_pages.outside_regions([region[5:], torch.ones(3)])[0].shape == (3,)
    del region
    gc.collect()
    assert address not in huge_pages.REGIONS


def _resident_mb() -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024


@pytest.mark.skipif(not huge_pages.huge_pages_offered(), reason="this system offers no transparent huge pages")
def test_only_a_region_read_into_is_resident_up_front():
    """into_huge_pages copies storage by storage and frees each old one as it goes: its region must fault in as the
    copy goes (a first start of a 7B Q4_K_M file peaked at 9.2 GB, the tiles twice, while it was zeroed up front)."""
    before = _resident_mb()
    untouched = huge_pages.huge_page_region(256 << 20)
    assert untouched is not None and _resident_mb() - before < 64
    touched = huge_pages.huge_page_region(256 << 20, touched=True)
    assert touched is not None and _resident_mb() - before >= 240


@pytest.mark.skipif(not huge_pages.huge_pages_offered(), reason="this system offers no transparent huge pages")
def test_a_region_read_into_is_the_one_faulted_in_ahead_for_its_size(tmp_path, monkeypatch):
    start = early_pages.EarlyRegions(tmp_path / "regions.json", "this")
    start.start([3 << 20])
    start.wait()
    monkeypatch.setattr(early_pages, "_START", start)
    assert huge_pages.huge_page_region(3 << 20) is not None and start.held() == 3 << 20  # a copy's: not taken
    first = ctypes.c_char.from_buffer(start.ready[0])
    early = ctypes.addressof(first)
    del first
    region = huge_pages.huge_page_region(3 << 20, touched=True)
    assert start.held() == 0 and early <= region.data_ptr() < early + huge_pages.HUGE_PAGE
    assert region.data_ptr() % huge_pages.HUGE_PAGE == 0 and region.shape == (3 << 20,) and not region.any()
    start.finish()
    assert early_pages.read_hints(tmp_path / "regions.json") == {"this": [3 << 20]}
