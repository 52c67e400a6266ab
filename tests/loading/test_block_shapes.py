"""What a cached block must look like to replace a layer (loading/block_shapes.py): the rules agree with the
quantizers' own output for every kind and shape they make, and any other dtype, shape or row count is named."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from specchat.loading.block_shapes import block_problem
from specchat.quant.int8_weights import Int8Block
from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_tiles import Q4Tiles

SHAPES = [(1, 64), (16, 64), (17, 128), (40, 320), (33, 256), (100, 384), (8, 1536)]


def _blocks(outs: int, width: int) -> list:
    weight = torch.randn(outs, width, generator=torch.Generator().manual_seed(outs * width))
    q4 = [Q4Tiles.from_block(Q4Block.quantize(weight, bits)) for bits in (4, 6, 8)]
    return [Int8Block.quantize(weight), Int8Block.quantize(weight.to(torch.bfloat16)), *q4]


@pytest.mark.parametrize("outs, width", SHAPES)
def test_what_the_quantizers_make_fits_the_layer(outs, width):
    layer = nn.Linear(width, outs, bias=False)
    assert [block_problem(block, layer) for block in _blocks(outs, width)] == [""] * 5


@pytest.mark.parametrize("outs, width", [(17, 128), (40, 320)])
def test_a_block_for_another_layer_shape_is_named(outs, width):
    for block in _blocks(outs, width):
        for other in (nn.Linear(width, outs + 1), nn.Linear(width + 64, outs), nn.Linear(width, outs - 1)):
            assert block_problem(block, other), (type(block).__name__, other)


def _altered(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensor one row short, one step longer in its last dimension, and in another dtype."""
    longer = torch.cat([tensor, tensor[..., :1]], dim=-1)
    other = torch.float64 if tensor.dtype != torch.float64 else torch.float32
    return [tensor[:-1], longer, tensor.to(other)]


def test_every_field_changed_in_dtype_or_shape_is_named():
    layer = nn.Linear(320, 40)
    for block in _blocks(40, 320):
        for field in dataclasses.fields(block):
            value = getattr(block, field.name)
            changes = [value + 16, value - 1] if isinstance(value, int) else _altered(value)
            for changed in changes:
                problem = block_problem(dataclasses.replace(block, **{field.name: changed}), layer)
                assert problem.startswith(f"{field.name} is"), (type(block).__name__, field.name, problem)


@pytest.mark.parametrize("kind", ["Q6_K", "IQ4_XS", "IQ4_NL"])
def test_a_files_own_halves_and_table_tiles_fit_and_their_scales_come_as_one_pair(kind):
    """Q6_K and IQ4_XS: sc and m int8 per 16 inputs; IQ4: qs int8 table indices. A cached block with one of sc and m
    a group's and the other a half's is named, not handed to the kernel."""
    from model_files import random_blocks

    from specchat.loading.gguf.blocks import AS_STORED

    tiles = Q4Tiles.from_block(AS_STORED[kind][1](torch.from_numpy(random_blocks(kind, 40, 512))))
    layer = nn.Linear(512, 40, bias=False)
    assert block_problem(tiles, layer) == ""
    if kind != "IQ4_NL":
        mixed = dataclasses.replace(tiles, m=torch.zeros(tiles.m.shape[0], 8, 32, dtype=torch.uint8))
        assert "both a group's" in block_problem(mixed, layer)
        assert block_problem(dataclasses.replace(tiles, sc=tiles.sc.view(torch.uint8)), layer)


def test_tiles_that_leave_out_unit_scales_or_dmin_fit_only_where_the_layout_allows():
    """Q4_0's tiles hold no sc (all 1) and no dmin (d): they fit. A cached block of 256-input blocks without its sc,
    or without a dmin whose d is another shape, is named, not handed to the kernel."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from specchat.loading.gguf.blocks import decode_group_type

    layer = nn.Linear(512, 40, bias=False)
    raw = quantize(torch.randn(40, 512).numpy(), GGMLQuantizationType.Q4_0)
    q4_0 = Q4Tiles.from_block(decode_group_type("Q4_0", torch.from_numpy(raw)))
    assert q4_0.sc.shape[2] == q4_0.dmin.shape[2] == 0 and block_problem(q4_0, layer) == ""
    q4_k = Q4Tiles.from_block(Q4Block.quantize(torch.randn(40, 512), 4))
    no_scales = dataclasses.replace(q4_k, sc=q4_k.sc[..., :0].contiguous())
    assert "only blocks of one 32-group" in block_problem(no_scales, layer)
    no_dmin = dataclasses.replace(q4_k, dmin=q4_0.dmin)
    assert block_problem(no_dmin, layer).startswith("dmin is left out (d's), yet d is [3, 2, 16]")
