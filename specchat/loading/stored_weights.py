"""Quantize once: a model's int8 or 4-bit weights (w8a8, weight-only int8, w4a8), stored on disk in the
cache folder beside the converted checkpoint: the stored weights.

Quantizing the 1.5B target takes tens of seconds; loading its int8 weights takes a few. The file
is keyed by the source's identity (the GGUF's sha256, or a fingerprint of a model directory), the
dtype it was loaded in and the mode. It is written to a temporary name, fsynced, and renamed into
place once whole; a sidecar records its size and sha256. A file found damaged (not the size or
sha256 recorded, not a well-formed file, or blocks whose dtypes and shapes do not fit the model's
layers) is rebuilt from the model with one notice line instead of an error. A file that cannot be
read (an I/O error, EACCES, too little memory) is kept and the start ends in one line naming it and
the errno: its content may well be good. A full disk while writing ends in one such line too.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn

from specchat.cache_folder import (
    DamagedFile,
    built_once,
    cache_dir,
    disk_error,
    disk_errors,
    file_sha256,
    is_verified,
    mark_verified,
    write_synced,
)
from specchat.config import W4A8_MODES
from specchat.errors import ModelLoadError
from specchat.kernels.build import q4_kernel
from specchat.loading import tensor_file
from specchat.loading.block_shapes import block_problem
from specchat.loading.file_tiles import (
    FileChanged,
    MarkedPlacement,
    as_stored_layers,
    layer_tiles,
    marked_layers,
    marker,
    marker_value,
    row_orders,
    tileable_layers,
)
from specchat.loading.gguf.blocks import matching_blocks, streamed_blocks
from specchat.loading.tile_arena import placer
from specchat.progress import Progress, notify, report
from specchat.quant.int8_weights import Int8Block, quantize_linears
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.shared import shared_input_groups
from specchat.quant.w4a8 import FINER_BITS, fitting_linears, quantize_w4a8
from specchat.quant.w8a8 import quantize_w8a8

FORMAT = 1  # bump when the layout or the quantization recipe changes
FORMATS = {
    "w4a8": 11,
    "w4a8-fast": 10,
}  # a mode's own format, where it changed apart (8/7: a GGUF's Q8_0, Q4_0... as stored; 9/8: Q6_K, IQ4_* too;
# 10/9: blocks of one group without their unit scales, dmin left out where it is d; 11/10: a user's GGUF's Q4_K
# and Q6_K layers a marker, tiled from the file at each start)
VERSIONED = re.compile(r"(?P<entry>.+)-v(?P<version>\d+)\.safetensors(?:\.json|\.verified)?")


def _quantize_w4a8(
    model: nn.Module, blocks: dict[str, Q4Tiles] | None, gguf=None, finer_bits: int = FINER_BITS, say=None
) -> dict[str, Q4Tiles]:
    """w4a8 from stored blocks, or from the model's weights and, where `gguf()` gives the GGUF file
    the model came from, that file's own Q4_K (and Q5_K) blocks bit for bit (the file's finer layers:
    finer_bits); say(line): the notice naming the file's blocks requantized (gguf/blocks.py). A model whose weights
    were never loaded (a slim checkpoint, loading/gguf/slim.py) has its blocks from the file: _write_streamed."""
    exact = matching_blocks(gguf(), model, finer_bits, say) if blocks is None and gguf is not None else None
    return quantize_w4a8(model, blocks, q4_kernel(), exact, finer_bits)


def _weights_unloaded(model: nn.Module) -> bool:
    return any(module.weight.is_meta for module in model.modules() if isinstance(module, nn.Linear))


FINER_BITS_OF = {"w4a8": FINER_BITS, "w4a8-fast": 4}  # each w4a8 mode's finer layers' bits, as QUANTIZERS has them
QUANTIZERS = {
    "w8a8": quantize_w8a8,
    "w8a8-fast": partial(quantize_w8a8, passes=1),
    "int8": quantize_linears,
    "w4a8": _quantize_w4a8,
    "w4a8-fast": partial(_quantize_w4a8, finer_bits=4),
}  # (model, blocks | None) -> blocks
DESCRIPTIONS = {
    "w8a8": "int8×int8",
    "w8a8-fast": "int8×int8 (8-bit activations)",
    "int8": "int8",
    "w4a8": "4-bit×int8",
    "w4a8-fast": "4-bit×int8 (every layer 4-bit)",
}
BLOCK_TYPES = dict.fromkeys(W4A8_MODES, Q4Tiles)  # how each mode's blocks are stored (w4a8: as the kernel reads them,
# no repacking at load); Int8Block otherwise
SAME_WEIGHTS = {"w8a8-fast": "w8a8"}  # modes that differ only in how activations are multiplied


def stored_weights_path(identity: str, dtype_label: str, mode: str) -> Path:
    mode = SAME_WEIGHTS.get(mode, mode)
    return cache_dir() / "quantized" / f"{identity[:16]}-{dtype_label}-{mode}-v{FORMATS.get(mode, FORMAT)}.safetensors"


def load_or_quantize(
    model: nn.Module,
    path: Path,
    label: str,
    mode: str = "w8a8",
    progress: Progress | None = None,
    gguf=None,
    file_stays: bool = False,
) -> str | None:
    """Quantize `model` in place (a mode of QUANTIZERS), from the stored weights at `path` when they are
    sound, else quantizing it and storing its weights (cache_folder.built_once: under the build lock, renamed
    into place).
    gguf: for the w4a8 modes, a function giving the GGUF file the model came from (its Q4_K blocks are
    used as they are), or None. file_stays: that file stays where it is (a user's own, not a bundled model's
    assembled copy): the layers it holds in Q4_K and Q6_K are tiled from it at each start (file_tiles.py), not
    stored.

    Returns a notice line when damaged stored weights were rebuilt, else None.
    """
    from_file = gguf if file_stays and mode in W4A8_MODES else None
    stored = _StoredBlocks(model, path, progress, mode, from_file)
    what = f"the {DESCRIPTIONS[mode]} weights of {label}"
    streamed = gguf is not None and mode in W4A8_MODES and _weights_unloaded(model)  # read a tensor at a time
    written_only = streamed and from_file is not None  # the model is quantized from what was written

    def quantize_into(tmp: Path) -> None:
        report(progress, f"quantizing {label} to {DESCRIPTIONS[mode]} (once; stored for later starts)", None)
        say = lambda line: notify(progress, f"{label}: {line}")
        if streamed:
            _write_streamed(tmp, path, model, mode, gguf(), say, markers=written_only)
            return
        options = {"gguf": gguf, "say": say} if mode in W4A8_MODES else {}
        orders = row_orders(from_file(), model) if from_file else {}  # before its layers are replaced
        blocks = QUANTIZERS[mode](model, None, **options)
        _write(tmp, path, blocks, as_stored_layers(from_file(), blocks, orders) if from_file else {})

    built = built_once(path, what, stored.problem, quantize_into, "write the stored weights", progress)
    if built:
        with disk_errors(path, "write the stored weights"):
            remove_older_formats(path)
        if not written_only:
            return stored.notice
        if stored.problem() != "":  # read back as a later start reads it: tiled from the file into their places
            raise ModelLoadError(f"the stored weights {path.name} just written do not read back: {stored.notice}")
    report(progress, f"loading the {DESCRIPTIONS[mode]} weights of {label}", None)
    QUANTIZERS[mode](model, stored.blocks)
    return stored.notice if built else None


def _write_streamed(tmp: Path, path: Path, model: nn.Module, mode: str, gguf: Path, say, markers: bool) -> None:
    """The stored weights of a model read a tensor at a time from a GGUF (its weights never loaded): the layers the
    compiled tiler makes from the file's blocks as they are (file_tiles.tileable_layers: the slow decoding's tiles bit
    for bit) and the others' made from the file's blocks (streamed_blocks). `markers`: the file stays, so those layers
    are a marker each and the model is left as it is (it reads back what was written); else their tiles are stored
    and the model quantized with them."""
    finer_bits = FINER_BITS_OF[mode]
    tiled = tileable_layers(gguf, model, finer_bits)
    blocks = {name: Q4Tiles.from_block(block) for name, block in streamed_blocks(gguf, model, finer_bits, say, tiled)}
    if markers:
        _write(tmp, path, blocks, tiled)
        return
    blocks |= layer_tiles(gguf, tiled)
    _write(tmp, path, blocks)
    QUANTIZERS[mode](model, blocks)


@dataclasses.dataclass
class _StoredBlocks:
    """What the stored weights at `path` hold for `model`: its blocks once read whole and fitting, and the notice
    of a damaged file read (and deleted) on the way."""

    model: nn.Module
    path: Path
    progress: Progress | None
    mode: str
    gguf: Callable[[], Path] | None = None  # the GGUF its marked layers are tiled from (file_tiles.py)
    blocks: dict | None = None
    notice: str | None = None

    def problem(self) -> str | None:
        """'' when the file is sound (its blocks kept), None when there is none (a damaged one is gone)."""
        self.blocks, notice = _sound_blocks(self.model, self.path, self.progress, self.mode, self.gguf)
        self.notice = notice or self.notice
        return None if self.blocks is None else ""


def _sound_blocks(model: nn.Module, path: Path, progress: Progress | None, mode: str, gguf=None):
    """(blocks, notice): the stored blocks (and those tiled from `gguf()` where they are marked) when whole and
    fitting this model's layers, else (None, why)."""
    kind = BLOCK_TYPES.get(mode, Int8Block)
    linears = _linears(model, mode)
    place = placer(shared_input_groups(linears)) if kind is Q4Tiles else None  # fused groups: views, not copies
    marked = None
    if place is not None and gguf is not None:
        place = marked = MarkedPlacement(
            place, {name: (lin.out_features, lin.in_features) for name, lin in linears.items()}
        )
    from_file = (lambda names, values: marked.tiles(gguf(), names, values)) if marked is not None else None
    blocks, notice = _read(path, progress, kind, place, from_file)
    if blocks is None:
        return None, notice
    if set(blocks) != set(linears):
        return None, f"rebuilt the stored weights {path.name}: they are for another model"
    for name, linear in linears.items():
        problem = block_problem(blocks[name], linear)
        if problem:  # damaged, or made to reach the kernels out of bounds: never handed over
            return None, _discard(path, f"the blocks of {name} do not fit the layer ({problem})")
    return blocks, None


def _linears(model: nn.Module, mode: str) -> dict[str, nn.Linear]:
    """The layers a mode quantizes: every nn.Linear, or for w4a8 those whose shape its kernel takes."""
    if mode in W4A8_MODES:
        return fitting_linears(model)
    return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def unquantized_layers(model: nn.Module, mode: str) -> list[str]:
    """After quantizing: the nn.Linear layers a w4a8 mode left as they were (shapes its kernel cannot take)."""
    if mode not in W4A8_MODES:
        return []
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def _read(
    path: Path, progress: Progress | None, kind: type = Int8Block, place=None, from_file=None
) -> tuple[dict | None, str | None]:
    """(blocks, None) when the file is whole; (None, None) when there is none; (None, notice) when it is
    damaged (deleted: it is rebuilt). A failure to read it raises ModelLoadError and keeps it."""
    try:
        if not path.exists():
            return None, None
        return _verified_blocks(path, progress, kind, place, from_file), None
    except DamagedFile as err:
        return None, _discard(path, str(err))
    except Exception as err:  # I/O, memory: says nothing about the content, so the file stays
        raise ModelLoadError(disk_error(err, path, "read the stored weights")) from err


def _verified_blocks(path: Path, progress: Progress | None, kind: type, place=None, from_file=None) -> dict:
    size, sha256 = _recorded(path)
    if not is_verified(path, size, sha256, progress):
        raise DamagedFile("its size or checksum does not match what was written")
    return _blocks_from_file(path, kind, place, from_file)


def _recorded(path: Path) -> tuple[int, str]:
    """The size and sha256 the sidecar records; DamagedFile where it is missing or unreadable."""
    try:
        meta = json.loads(_meta_path(path).read_text())
        return int(meta["size"]), str(meta["sha256"])
    except FileNotFoundError:
        raise DamagedFile(f"its record {_meta_path(path).name} is missing") from None
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DamagedFile(f"its record {_meta_path(path).name} is unreadable") from None


def _discard(path: Path, reason: str) -> str:
    """Delete damaged stored weights; the notice line saying they are rebuilt and why."""
    with disk_errors(path, "remove the damaged stored weights"):
        path.unlink(missing_ok=True)
    return f"rebuilt the stored weights {path.name}: {reason}"


def _blocks_from_file(path: Path, kind: type = Int8Block, place=None, from_file=None) -> dict:
    """The blocks (of dataclass `kind`), read into fresh memory (loading/tensor_file.py), or where `place` puts
    them (w4a8: tile_arena.placer): not mapped, as the mapped pages of a file stay resident (a mapped copy of the
    fused groups' tiles held 0.9 GB of the bundled pair twice), and aligned (torch's CPU int8 kernel crashes on
    misaligned weights from 8 rows up). Layers marked to be tiled from the GGUF (file_tiles.py) are, by
    from_file({layer: type}, {layer: what its marker holds})."""
    tensors = tensor_file.read_tensors(path, place)
    marked = marked_layers(tensors)
    names = {key.rsplit(".", 1)[0] for key in tensors} - set(marked)
    fields = dataclasses.fields(kind)
    try:
        blocks = {
            name: kind(*(_field_value(tensors[f"{name}.{field.name}"], field) for field in fields)) for name in names
        }
    except KeyError as err:
        raise DamagedFile(f"it lacks {err.args[0]}") from None
    if not marked:
        return blocks
    if from_file is None:
        raise DamagedFile("it names layers to tile from a GGUF file, and none is at hand")
    try:
        return blocks | from_file(marked, {layer: tensors[f"{layer}.{marker(kind)}"] for layer, kind in marked.items()})
    except FileChanged as err:
        raise DamagedFile(str(err)) from None


def _field_value(tensor: torch.Tensor, field: dataclasses.Field):
    """A block's field as stored: a tensor, or a whole number (stored as a 0-dim tensor)."""
    if field.type != "int":
        return tensor
    if tensor.dim() != 0 or tensor.is_floating_point() or tensor.dtype == torch.bool:
        raise DamagedFile(f"its {field.name} is not a whole number")
    return int(tensor.item())


def _write(tmp: Path, path: Path, blocks: dict, from_file: dict | None = None) -> None:
    """Write the blocks to `tmp`, the temporary of `path`, and record its size and sha256 beside `path`, each
    fsynced (cache_folder.built_once renames it into place). The layers `from_file` ({layer: (GGML type, row order
    or None)}) are written as a marker (file_tiles.py): a start tiles them from the GGUF."""
    from_file = from_file or {}
    tensors = {f"{name}.{marker(kind)}": marker_value(kind, order) for name, (kind, order) in from_file.items()}
    for name, block in blocks.items():
        if name in from_file:
            continue
        tensors.update(
            {f"{name}.{field.name}": torch.as_tensor(getattr(block, field.name)) for field in dataclasses.fields(block)}
        )
    tensor_file.write_tensors(tmp, tensors)
    meta = {"format": FORMAT, "size": tmp.stat().st_size, "sha256": file_sha256(tmp)}
    write_synced(_meta_path(path), json.dumps(meta) + "\n")
    mark_verified(path, meta["sha256"], written=tmp)  # the next start need not hash what this one just hashed


def remove_older_formats(path: Path) -> list[Path]:
    """Delete the copies of these stored weights in other format versions (same source, dtype and mode,
    `-v<N>.safetensors` with another N, and their sidecars): after an upgrade they are never read
    again, and a target's is about a GB. Returns what was deleted; nothing for a name without `-v<N>`."""
    named = VERSIONED.fullmatch(path.name)
    if named is None:
        return []
    removed = []
    for other in path.parent.glob(f"{glob.escape(named['entry'])}-v*.safetensors*"):
        match = VERSIONED.fullmatch(other.name)
        if match and match["entry"] == named["entry"] and match["version"] != named["version"]:
            other.unlink(missing_ok=True)
            removed.append(other)
    return removed


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")
