"""A pair's GGUFs that hold one tokenizer convert it once (gguf/convert.py's _gguf_tokenizer, keyed by
gguf/header.py's TOKENIZER_DIGEST): each checkpoint still holds the tokenizer a conversion of its own file makes."""

from __future__ import annotations

import torch
from model_files import tiny_qwen2, vocab_size, write_gguf
from transformers import AutoTokenizer

from specchat.loading.gguf import convert
from specchat.loading.gguf.header import TOKENIZER_DIGEST, read_tensors


def tokenizer_files(folder) -> dict[str, bytes]:
    names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    return {name: (folder / name).read_bytes() for name in names if (folder / name).exists()}


def test_a_pair_of_one_tokenizer_converts_it_once_and_each_checkpoint_holds_its_own(tmp_path, tokenizer, monkeypatch):
    """Other weights, or another chat template (the bundled pair's two differ): the first file's vocabulary, each
    file's own template; no template at all is another tokenizer."""
    rows = vocab_size(tokenizer)
    first = write_gguf(tmp_path / "first.gguf", tiny_qwen2(rows, seed=1), tokenizer)
    other_weights = write_gguf(tmp_path / "other-weights.gguf", tiny_qwen2(rows, seed=2), tokenizer)
    other_template = write_gguf(
        tmp_path / "other-template.gguf", tiny_qwen2(rows, seed=1), tokenizer, chat_template="{{ messages[0].content }}"
    )
    no_template = write_gguf(tmp_path / "no-template.gguf", tiny_qwen2(rows, seed=1), tokenizer, chat_template=None)
    files = (first, other_weights, other_template, no_template)
    digests = [read_tensors(path)[0][TOKENIZER_DIGEST] for path in files]
    assert digests[0] == digests[1] == digests[2] != digests[3]

    made = []
    convert_as_is = AutoTokenizer.from_pretrained
    monkeypatch.setattr(
        convert.AutoTokenizer, "from_pretrained", lambda *a, **k: made.append(k["gguf_file"]) or convert_as_is(*a, **k)
    )
    monkeypatch.setattr(convert, "_last_tokenizer", {})
    for path in files:
        convert.convert_gguf(path, torch.float32, tmp_path / f"converted-{path.stem}", path.stem)
    assert made == ["first.gguf", "no-template.gguf"]  # the next two files' vocabulary was the first's

    for path in files:  # what a conversion of each file alone writes
        alone = tmp_path / f"alone-{path.stem}"
        convert_as_is(str(path.parent), gguf_file=path.name, local_files_only=True).save_pretrained(alone)
        assert tokenizer_files(tmp_path / f"converted-{path.stem}") == tokenizer_files(alone), path.stem
    assert b"messages[0]" in (tmp_path / "converted-other-template" / "chat_template.jinja").read_bytes()
    text = "def reverse(items):\n    return items[::-1]  # ✓"
    again = convert_as_is(tmp_path / "converted-other-weights")
    alone = convert_as_is(tmp_path, gguf_file=other_weights.name, local_files_only=True)
    assert again(text)["input_ids"] == alone(text)["input_ids"] and len(again(text)["input_ids"]) > 10


def test_a_token_spelled_otherwise_is_another_tokenizer(tmp_path, tokenizer):
    path = write_gguf(tmp_path / "first.gguf", tiny_qwen2(vocab_size(tokenizer), seed=1), tokenizer)
    data = path.read_bytes()
    at = data.index(b"<|im_end|>")  # in the vocabulary, which comes before the template
    changed = tmp_path / "changed.gguf"
    changed.write_bytes(data[:at] + b"<|im_enD|>" + data[at + 10 :])
    assert read_tensors(changed)[0][TOKENIZER_DIGEST] != read_tensors(path)[0][TOKENIZER_DIGEST]
