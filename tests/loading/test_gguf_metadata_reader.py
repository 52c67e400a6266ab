"""transformers' legacy GGUF metadata read (the config of every architecture its newer reader leaves to it) gives
the same config on specchat's struct walk (gguf/metadata_reader.py) as on gguf-py's GGUFReader, and a read with
tensors inside quick_metadata() still gets gguf-py's reader."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import transformers.modeling_gguf_pytorch_utils as legacy
from model_files import CONFIGS, tiny_model, vocab_size, write_gguf

from specchat.loading.gguf import metadata
from specchat.loading.gguf.metadata import quick_metadata
from specchat.loading.gguf.metadata_reader import MetadataReader


@pytest.mark.parametrize("architecture", sorted(set(CONFIGS) - {"mistral"}))  # mistral: a llama file
def test_the_struct_walk_gives_the_config_gguf_py_s_reader_gives(tmp_path, tokenizer, architecture):
    path = write_gguf(
        tmp_path / f"{architecture}.gguf",
        tiny_model(architecture, vocab_size(tokenizer, architecture), tied=architecture.startswith("gemma")),
        tokenizer,
        architecture=architecture,
    )
    as_read = legacy.load_gguf_checkpoint(str(path), return_tensors=False)
    with quick_metadata():
        walked = legacy.load_gguf_checkpoint(str(path), return_tensors=False)
    assert walked["config"] == as_read["config"] and walked["config"]["model_type"]
    assert (
        len(walked["tokenizer"]["tokens"]) == len(as_read["tokenizer"]["tokens"]) == vocab_size(tokenizer, architecture)
    )


def test_every_value_outside_the_tokenizer_s_arrays_is_read_as_gguf_py_reads_it(tmp_path):
    """Each value type, a string array and a number array, and the tokenizer's arrays walked past."""
    path = tmp_path / "values.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_int64("test.i64", -3)
    writer.add_float32("test.f32", 0.25)
    writer.add_float64("test.f64", 1e-7)
    writer.add_bool("test.bool", True)
    writer.add_string("test.text", "héllo")
    writer.add_array("test.numbers", [1, 2, 3])
    writer.add_array("test.words", ["a", "bc"])
    writer.add_token_list(["x", "y", "z"])
    writer.add_token_merges(["x y"])
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    theirs, ours = gguf.GGUFReader(str(path)), MetadataReader(path)
    parse = legacy._gguf_parse_value
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert mine.types == list(field.types)
        if key.startswith("tokenizer."):
            assert len(mine.data) == (3 if key == "tokenizer.ggml.tokens" else 0)
            continue
        assert [parse(mine.parts[i], mine.types) for i in mine.data] == [
            parse(field.parts[i], field.types) for i in field.data
        ]
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors] == ["token_embd.weight"]


def test_a_read_with_tensors_inside_the_block_gets_gguf_py_s_reader(tmp_path, tokenizer):
    path = write_gguf(tmp_path / "m.gguf", tiny_model("qwen2", vocab_size(tokenizer)), tokenizer)
    with quick_metadata():
        assert isinstance(gguf.GGUFReader(str(path)), metadata._saved[2])
        metadata._metadata_only.on = True
        try:
            assert isinstance(gguf.GGUFReader(str(path)), MetadataReader)
        finally:
            metadata._metadata_only.on = False
    assert gguf.GGUFReader is metadata._saved[2]
