"""A tied file whose embeddings are in blocks (llama-quantize's Q4_K_M and Q8_0 of Llama-3.2 or Qwen3-0.6B/1.7B:
no output.weight, token_embd in Q6_K or Q8_0): the w4a8 head is read from the embeddings' blocks, which the slim
checkpoint keeps apart from the state dict's names (loading/gguf/tensors.py)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from model_files import tiny_model, vocab_size, write_gguf
from test_gguf_architectures import cache, on_the_cpu
from tiny_models import build_tokenizer

from specchat.config import ModelConfig
from specchat.loading.models import load_model
from specchat.settings import load_config

PROMPT_IDS = list(range(3, 40))


FIXTURES = (cache, on_the_cpu)  # test_gguf_architectures' autouse fixtures, on here too


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_tied_file_with_block_embeddings_loads_w4a8_with_the_embeddings_as_its_head(tmp_path, kernel, architecture):
    tok = build_tokenizer()
    model = tiny_model(architecture, vocab_size(tok, architecture), seed=4, tied=True)
    stored = {"token_embd.weight": GGMLQuantizationType.Q8_0}
    path = write_gguf(tmp_path / "tied.gguf", model, tok, stored=stored, architecture=architecture)
    loaded, _, facts = load_model(load_config(None, [f"target.source={path}"]).target)
    assert facts.backend == "lean (compiled layers)"
    with torch.inference_mode():
        got = loaded(torch.tensor([PROMPT_IDS])).logits[0]
        want = model(torch.tensor([PROMPT_IDS])).logits[0]
    agreement = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agreement >= 0.8, f"top-1 agreement with the file's model: {agreement:.0%}"  # 4-bit, a near-flat tiny model


@pytest.mark.parametrize("architecture", ["gemma2", "qwen2"])
def test_a_tied_q4_k_head_is_read_as_stored_whether_the_file_streams_or_converts_in_full(
    tmp_path, kernel, architecture
):
    """Gemma-2 converts in full (matching_blocks), Qwen2 streams (streamed_blocks): both take the tied head's Q4_K
    blocks bit for bit, with no notice. Gemma-2's was requantized to 6 bits, silently: the tied head's tensor is
    named token_embd.weight, which named no layer."""
    from model_files import BLOCK_WIDE, write_gguf_in

    from specchat.quant.w4a8 import Q4Linear

    tok = build_tokenizer()
    model = tiny_model(architecture, vocab_size(tok, architecture), seed=1, tied=True, **BLOCK_WIDE)
    path = write_gguf_in(tmp_path / "tied.gguf", model, tok, "Q4_K", architecture=architecture)
    lines = []
    loaded, _, _ = load_model(load_config(None, [f"target.source={path}"]).target, lambda m, f: lines.append(str(m)))
    floats, _, _ = load_model(ModelConfig(source=str(path), quantization="none", dtype="float32", device="cpu"))
    head = loaded.get_output_embeddings()
    assert isinstance(head, Q4Linear) and head.tiles.bits == 4
    assert torch.equal(head.tiles.dequantize(), floats.get_output_embeddings().weight.detach().float())
    assert not [line for line in lines if "requantized" in line]
