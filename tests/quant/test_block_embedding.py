"""An embedding table kept in GGML blocks: the rows it gives, from its recent rows or freshly dequantized."""

import numpy as np
import torch
from gguf import GGMLQuantizationType, dequantize, quantize

from specchat.quant import block_embedding
from specchat.quant.block_embedding import BlockEmbedding


def q8_table(rows: int = 40, width: int = 64) -> tuple[BlockEmbedding, torch.Tensor]:
    """A BlockEmbedding over random Q8_0 rows, and the float32 table they dequantize to."""
    rng = np.random.default_rng(0)
    raw = quantize(rng.standard_normal((rows, width)).astype(np.float32), GGMLQuantizationType.Q8_0)
    table = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q8_0).astype(np.float32))
    return BlockEmbedding(torch.from_numpy(np.array(raw)), "Q8_0", width), table


def test_rows_read_again_after_others_pushed_them_out_are_the_tables(monkeypatch):
    monkeypatch.setattr(block_embedding, "RECENT_ROWS", 4)
    embedding, table = q8_table()
    for ids in ([[0, 5, 5, 39]], [[1, 2, 3, 4, 6, 7]], [[0]], [[5, 0, 9]], [[39, 39]]):
        ids = torch.tensor(ids)
        assert torch.equal(embedding(ids), torch.nn.functional.embedding(ids, table)), ids
        assert len(embedding._recent) <= 4


def test_a_caller_changing_the_rows_it_got_changes_no_later_read():
    embedding, table = q8_table()
    ids = torch.tensor([[7, 8]])
    embedding(ids).mul_(0)
    assert torch.equal(embedding(ids), torch.nn.functional.embedding(ids, table))
