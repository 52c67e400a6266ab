"""loading/huge_pages.py: the w4a8 tiles moved into 2 MB pages, values, views and alignment kept; nothing moved where
the system offers no huge pages."""

from __future__ import annotations

import pytest
import torch

from specchat import early_pages
from specchat.loading.huge_pages import HUGE_PAGE, huge_pages_offered, into_huge_pages, w4a8_tensors

offered = pytest.mark.skipif(not huge_pages_offered(), reason="this system offers no transparent huge pages")


def mapping_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address` (/proc/self/smaps)."""
    holds = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(bound, 16) for bound in head.split("-"))
                holds = start <= address < end
            elif holds and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@offered
def test_tensors_move_with_their_values_views_and_alignment():
    fused = torch.randint(0, 255, (300, 64, 16), dtype=torch.uint8)
    tensors = [
        fused,
        fused[:100],  # views of one storage stay views of one
        fused[100:],
        torch.randn(7, 3).half(),  # a size that is no multiple of 64
        torch.arange(1000, dtype=torch.float32)[5:],  # a view that starts past its storage's first byte
    ]
    expected = [tensor.clone() for tensor in tensors]
    skips = [tensor.storage_offset() * tensor.element_size() for tensor in tensors]  # bytes into their storages
    moved = into_huge_pages(tensors)
    assert moved >= fused.nbytes + 42 + 4000 and moved % 64 == 0
    assert all(torch.equal(tensor, value) for tensor, value in zip(tensors, expected, strict=True))
    assert len({tensor.untyped_storage().data_ptr() for tensor in tensors}) == 1  # one region
    assert tensors[1].data_ptr() == fused.data_ptr() and tensors[2].data_ptr() == fused.data_ptr() + 100 * 64 * 16
    starts = [tensor.data_ptr() - skip for tensor, skip in zip(tensors, skips, strict=True)]  # each storage's copy
    assert all(start % 64 == 0 for start in starts) and min(starts) % HUGE_PAGE == 0
    assert "hg" in mapping_flags(fused.data_ptr())  # the region asks for huge pages (MADV_HUGEPAGE)


@offered
def test_the_kernel_gives_the_same_products_from_the_moved_tiles_and_groups_stay_views(kernel, tokenizer):
    from tiny_models import build_model

    from specchat.quant.w4a8 import Q4Linear, quantize_w4a8, run_kernel

    model = build_model(len(tokenizer), seed=2, layers=2, hidden=128)
    quantize_w4a8(model, None, kernel)
    layers = [module for module in model.modules() if isinstance(module, Q4Linear)]
    x = torch.randn(3, 128)
    before = [run_kernel(layer.product, x, layer.tiles) for layer in layers if layer.in_features == 128]
    tensors = w4a8_tensors(model)
    grouped = [layer for layer in layers if layer.group]
    held = {id(tensor) for tensor in tensors}
    assert grouped and all(id(t) in held for layer in grouped for t in layer.group[0].fused.tensors())
    assert into_huge_pages(tensors) > 0
    after = [run_kernel(layer.product, x, layer.tiles) for layer in layers if layer.in_features == 128]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    for layer in grouped:  # a fused layer's tiles are still rows of its group's tiles
        fused = layer.group[0].fused.qs
        assert fused.data_ptr() <= layer.tiles.qs.data_ptr() < fused.data_ptr() + fused.nbytes


@pytest.mark.parametrize("setting", ["always madvise [never]\n", None])
def test_nothing_moves_where_huge_pages_are_off_or_unknown(tmp_path, setting):
    path = tmp_path / "enabled"
    if setting is not None:
        path.write_text(setting)
    tensor = torch.ones(1000)
    address = tensor.data_ptr()
    assert not huge_pages_offered(path)
    assert into_huge_pages([tensor], path) == 0 and tensor.data_ptr() == address


def test_huge_pages_are_offered_where_the_setting_is_madvise_or_always(tmp_path, monkeypatch):
    monkeypatch.setattr(early_pages.sys, "platform", "linux")
    path = tmp_path / "enabled"
    for text, expected in [("always [madvise] never", True), ("[always] madvise never", True), ("", False)]:
        path.write_text(text)
        assert huge_pages_offered(path) is expected


def test_loading_a_w4a8_model_moves_its_tiles(tokenizer, tmp_path, monkeypatch):
    from tiny_models import build_model

    from specchat.config import ModelConfig
    from specchat.loading import models

    path = tmp_path / "tiny"
    build_model(len(tokenizer), seed=3, layers=1, hidden=128).save_pretrained(path)
    tokenizer.save_pretrained(path)
    moved = []
    monkeypatch.setattr(models, "huge_pages_offered", lambda: True)
    monkeypatch.setattr(models, "into_huge_pages", lambda tensors: moved.append(tensors))
    models.load_model(ModelConfig(source=str(path), dtype="float32", quantization="w4a8"))
    assert moved and len(moved[0]) >= 5 * 7  # a layer's seven linears (each 5 tensors), the head's too


@pytest.mark.parametrize("fails", ["mmap", "madvise"])
def test_the_tiles_stay_where_they_are_when_the_region_cannot_be_had(monkeypatch, tmp_path, fails):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never")
    monkeypatch.setattr(early_pages.sys, "platform", "linux")

    class Region:
        def __init__(self, *args, **kwargs):
            if fails == "mmap":
                raise OSError(12, "Cannot allocate memory")

        def madvise(self, *args):
            raise OSError(22, "Invalid argument")

        def close(self):
            pass

    monkeypatch.setattr(early_pages.mmap, "mmap", Region)
    tensor = torch.arange(5000, dtype=torch.float32)
    address = tensor.data_ptr()
    assert into_huge_pages([tensor], path) == 0
    assert tensor.data_ptr() == address and torch.equal(tensor, torch.arange(5000, dtype=torch.float32))


@offered
def test_an_inference_tensor_stays_where_it_is_and_the_others_move():
    with torch.inference_mode():
        made_in_inference = torch.arange(3000, dtype=torch.float32)
    plain = torch.arange(3000, dtype=torch.float32)
    addresses = [made_in_inference.data_ptr(), plain.data_ptr()]
    assert into_huge_pages([made_in_inference, plain]) > 0
    assert made_in_inference.data_ptr() == addresses[0] and plain.data_ptr() != addresses[1]
    assert torch.equal(plain, made_in_inference)
