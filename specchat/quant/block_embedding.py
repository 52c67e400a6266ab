"""An embedding table kept in its GGUF blocks: a forward dequantizes only the rows of the ids it reads.

The bundled pair's tables are 151,936 rows; as float32 they took 1.5 GB of the 4.2 GB a warm chat held, for
one row a token. In the file's own blocks (Q4_K for the target, Q5_0 for the drafter) they take 0.22 GB.
Each row is dequantized by gguf-py, the very function transformers' GGUF loading uses, so a row's values
are bit for bit the float32 table's. The rows of the ids read most recently stay dequantized (RECENT_ROWS):
a decoding step reads one id, mostly one the chat has used before, and gguf-py's numpy calls took 0.6 ms of
a 17 ms drafter step here.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from torch import nn

RECENT_ROWS = 2048  # dequantized rows kept (12 MB for the bundled target's 1536-wide table)


class BlockEmbedding(nn.Module):
    """A drop-in nn.Embedding (forward, num_embeddings, embedding_dim) over rows of GGML blocks."""

    def __init__(self, blocks: torch.Tensor, kind: str, width: int):
        """blocks: uint8 [rows, bytes a row] as the GGUF stores them; kind: their GGML type name (Q4_K, ...)."""
        from gguf import GGMLQuantizationType

        super().__init__()
        self.register_buffer("blocks", blocks.contiguous())
        self.kind, self.ggml_type = kind, GGMLQuantizationType[kind]
        self.num_embeddings, self.embedding_dim = blocks.shape[0], width
        self.dtype = torch.float32
        self._recent: OrderedDict[int, torch.Tensor] = OrderedDict()  # id → its row, the latest read last

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids.reshape(-1)).reshape(*ids.shape, self.embedding_dim)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), width]: the rows `ids`, dequantized (those read recently, from memory)."""
        wanted = ids.reshape(-1).tolist()
        missing = [i for i in dict.fromkeys(wanted) if i not in self._recent]
        if missing:
            # each row its own copy: a view would keep its whole batch (a prompt's chunk) in memory
            self._recent.update(zip(missing, (row.clone() for row in self._dequantize(missing))))
        for i in wanted:
            self._recent.move_to_end(i)
        found = torch.stack([self._recent[i] for i in wanted])
        while len(self._recent) > RECENT_ROWS:
            self._recent.popitem(last=False)
        return found

    def _dequantize(self, ids: list[int]) -> torch.Tensor:
        """float32 [len(ids), width], dequantized by gguf-py."""
        from gguf import dequantize

        raw = self.blocks[torch.tensor(ids, dtype=torch.long)].numpy()
        return torch.from_numpy(np.asarray(dequantize(raw, self.ggml_type), dtype=np.float32).reshape(len(ids), -1))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.kind} blocks"
