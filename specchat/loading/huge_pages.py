"""The w4a8 tiles moved into 2 MB pages.

A decode step reads every weight once: 1.1 GB a token for a Qwen3-1.7B-shaped Q4_K_M file. In 4 KB pages that
is 270,000 pages a token, each a TLB miss and a page walk, and the hardware prefetchers stop at each page's end.
llama.cpp maps its GGUF file, and Linux mapped 346 of that file's 1107 MB in 2 MB pages. Here the tiles
are copied into one anonymous region that asks for transparent huge pages (madvise MADV_HUGEPAGE), 2 MB-aligned,
each storage 64-byte aligned, and every tensor is pointed at its copy (Tensor.set_), so views of one storage stay
views of one. One process alternating 12 times (AMD EPYC Zen 4, 2 vCPUs): a token 1.039× faster on the Qwen3-1.7B
shape, 1.065× on the Llama-3.2-1B shape (the bundled 1.5B target: 1.005×, no gain shown).

Linux only, where transparent huge pages are not switched off ("never"); elsewhere nothing moves. The region lives
as long as any of the tensors does.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
from torch import nn

from specchat import early_pages
from specchat.early_pages import HUGE_PAGE, THP_SETTING, anonymous_region, huge_pages_offered
from specchat.memory import FreedPages, release_freed_memory
from specchat.quant.w4a8 import Q4Linear

# bytes moved between handing the old pages back (the warm start's peak: 2.19 -> 2.11 GB at 64 MB)
RETURN_EVERY = 16 << 20
ALIGN = 64  # each storage's first byte, as torch's allocator aligns them (the kernels read them with SIMD loads)


def w4a8_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors of every w4a8 layer's tiles, and of the fused tiles of the groups they belong to (Q4Group:
    what the compiled layer loop reads), each once."""
    tensors: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, Q4Linear):
            groups = [module.group[0].fused] if module.group else []
            for tiles in [module.tiles, *groups]:
                tensors.update((id(tensor), tensor) for tensor in tiles.tensors())
    return list(tensors.values())


REGIONS: set[int] = set()  # first bytes of the live regions made here: their storages are in 2 MB pages already


def huge_page_region(nbytes: int, setting: Path = THP_SETTING, touched: bool = False) -> torch.Tensor | None:
    """A uint8 tensor of `nbytes` in an anonymous region that asks for 2 MB pages, its first byte 2 MB-aligned;
    None where they are not offered, there is no room, or the kernel refuses the advice. The region lives as long
    as any tensor viewing it. `touched`: zeroed up front, every page resident at once (for a region a file is read
    into; a copy that frees the old pages as it goes leaves them to fault in one at a time, so as not to hold both):
    one faulted in ahead of this size where the start made one (early_pages.py)."""
    early = early_pages.take(nbytes) if touched else None
    mapped = early if early is not None else anonymous_region(nbytes, setting)
    if mapped is None:
        return None
    whole = torch.frombuffer(mapped, dtype=torch.uint8)  # holds the region while any tensor points into it
    start = -whole.data_ptr() % HUGE_PAGE
    address = whole.data_ptr()
    REGIONS.add(address)
    weakref.finalize(whole.untyped_storage(), REGIONS.discard, address)
    region = whole[start : start + nbytes]
    # reading 1 GB of a file into fresh pages of such a region took 1.12 s, zeroing it first 0.06 s and the read then
    # 0.09 s (Zen 5; 0.45 s into torch.empty)
    return region.zero_() if touched and early is None else region


def outside_regions(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors not in a region made by huge_page_region."""
    return [tensor for tensor in tensors if tensor.untyped_storage().data_ptr() not in REGIONS]


def into_huge_pages(tensors: list[torch.Tensor], setting: Path = THP_SETTING) -> int:
    """Move the CPU tensors' storages into one region of 2 MB pages; returns the bytes moved (0: none). Storages
    already in such a region (huge_page_region: the tiles read from stored weights, tile_arena.py) stay."""
    storages = _storages(outside_regions(tensors))
    if not storages or not huge_pages_offered(setting):
        return 0
    offsets, total = _layout(storages)
    release_freed_memory()  # what loading freed (a fused layer's own tiles...) back first: not held beside the copy
    arena = huge_page_region(total, setting)
    if arena is None:  # the tiles stay where they are
        return 0
    base = arena.storage_offset()  # the arena's first byte in its region (2 MB-aligned)
    freed = FreedPages(RETURN_EVERY)
    with torch.no_grad():
        while storages:  # each old storage let go once its tensors have moved: the copy never holds both in whole
            address, (storage, views) = storages.popitem()
            nbytes = storage.nbytes()
            first = offsets[address]
            arena[first : first + nbytes].copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
            for view in views:
                at = (base + first) // view.element_size() + view.storage_offset()
                view.set_(arena.untyped_storage(), at, view.size(), view.stride())
            del storage, views
            freed.let_go(nbytes)
    release_freed_memory()
    return total


Storages = dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]]  # address: (storage, the tensors viewing it)


def _storages(tensors: list[torch.Tensor]) -> Storages:
    """The non-empty CPU storages of `tensors`, each tensor once; not an inference tensor's (set_ would refuse it
    outside inference mode: it stays where it is)."""
    storages: Storages = {}
    seen: set[int] = set()
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if tensor.device.type != "cpu" or tensor.is_inference() or not storage.nbytes() or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        storages.setdefault(storage.data_ptr(), (storage, []))[1].append(tensor)
    return storages


def _layout(storages: Storages) -> tuple[dict[int, int], int]:
    """Each storage's first byte in the region (ALIGN-aligned, in address order), and the bytes it takes."""
    offsets, total = {}, 0
    for address in sorted(storages):
        offsets[address] = total
        total += -(-storages[address][0].nbytes() // ALIGN) * ALIGN
    return offsets, total
