"""`python -m specchat.bench.profile --layer-types`: the kernel over one layer of a real shape in each GGUF type."""

from __future__ import annotations

import pytest
import torch

from specchat.bench import layer_types, profile


@pytest.mark.parametrize("kind", layer_types.TYPES)
def test_each_types_random_blocks_decode_to_finite_weights_of_the_layers_shape(kind):
    shape = layer_types.SHAPES["tiny"]
    tiles = layer_types.layer_tiles(kind, shape)
    assert [(t.outs, t.sc.shape[1] * 32) for t in tiles] == shape.weights()
    weights = tiles[1].dequantize()
    assert weights.isfinite().all() and weights.abs().max() > 0


def test_the_table_gives_each_type_its_bits_and_ratios(kernel, capsys):
    code = profile.main(["--layer-types", "Q4_K", "Q4_0", "--shape", "tiny", "--rows", "1", "3", "--repeats", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "tiny-shape layer" in out and f"{torch.get_num_threads()} threads" in out
    assert "| type | bits a weight held | T(1) ms | T(3)/T(1) |" in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| Q4")}
    assert set(rows) == {"Q4_K", "Q4_0"}
    assert rows["Q4_0"].split(" | ")[1] == "4.75"  # 16 bytes of levels, m and d a group: no scales, no dmin


def test_an_unknown_type_is_one_line_and_exit_2(capsys):
    assert profile.main(["--layer-types", "Q4_0", "Q9_9"]) == 2
    err = capsys.readouterr().err
    assert "--layer-types: no kernel type Q9_9 (known: Q4_K" in err and err.count("\n") == 1
