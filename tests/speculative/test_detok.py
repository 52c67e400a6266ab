"""Streaming detokenization: the deltas of a reply concatenate to decode(ids), on long multi-byte
replies, with the tiny byte-level tokenizer and the bundled Qwen tokenizer, in linear time."""

from __future__ import annotations

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specchat.loading.assets import BUNDLED, cache_dir
from specchat.loading.gguf.convert import converted_dir, is_converted
from specchat.speculative.detok import REPLACEMENT, Detokenizer

PARAGRAPH = (
    "Café crème, naïve façade, Ångström, smørrebrød, Straße, ñandú, Dvořák. "
    "日本語のテキストと中文文本，한국어 텍스트. 🙂 👩‍💻 🇯🇵 🧑🏽‍🚀 ✓ → ∑ ≠ ∞. "
    "def reverse(lst):\n    return lst[::-1]  # « quoted » — dash … ellipsis\n"
)
LONG_REPLY = PARAGRAPH * 40  # about 6000 characters


def streamed(tokenizer, ids: list[int]) -> list[str]:
    """Every delta the detokenizer emits for `ids`, the final flush last."""
    detok = Detokenizer(tokenizer)
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """The bundled pair's tokenizer, from a converted checkpoint in the cache, slim or full (no network)."""
    for model in BUNDLED.values():
        for dtype, slim in ((torch.float32, True), (torch.bfloat16, False), (torch.float32, False)):
            if is_converted(model.sha256, dtype, slim):
                return AutoTokenizer.from_pretrained(converted_dir(model.sha256, dtype, slim))
    pytest.skip(f"the bundled Qwen tokenizer is not converted in {cache_dir()} yet (`make chat` does it once)")


@pytest.fixture(params=["tiny", "qwen"])
def any_tokenizer(request, tokenizer):
    return tokenizer if request.param == "tiny" else request.getfixturevalue("qwen_tokenizer")


def test_deltas_of_a_long_multibyte_reply_concatenate_to_decode(any_tokenizer):
    ids = any_tokenizer.encode(LONG_REPLY)
    deltas = streamed(any_tokenizer, ids)
    assert "".join(deltas) == any_tokenizer.decode(ids, skip_special_tokens=True) == LONG_REPLY
    assert not any(REPLACEMENT in d for d in deltas)  # split characters are held, never shown half


def test_characters_split_over_tokens_are_held_until_complete(tokenizer):
    ids = tokenizer.encode("é 日本 ok ünïcode")
    assert len(ids) > 4 * 3  # the tiny tokenizer spells each multi-byte character byte by byte
    deltas = streamed(tokenizer, ids)
    assert deltas[:3] == ["", "é", " "]  # é is two byte tokens: nothing, then the whole character
    assert "".join(deltas) == "é 日本 ok ünïcode"


def test_random_ids_stream_exactly_what_decode_gives(any_tokenizer):
    """Random tokens, most of them single bytes >= 0xA1: partial characters, invalid UTF-8 (real U+FFFD
    in the text) and, among the others, special tokens."""
    single_bytes = [any_tokenizer.convert_tokens_to_ids(chr(b)) for b in range(0xA1, 0x100) if b != 0xAD]
    rng = random.Random(7)
    for _ in range(20):
        ids = [
            rng.choice(single_bytes) if rng.random() < 0.8 else rng.randrange(len(any_tokenizer)) for _ in range(300)
        ]
        assert "".join(streamed(any_tokenizer, ids)) == any_tokenizer.decode(ids, skip_special_tokens=True)


def test_a_long_run_of_invalid_bytes_streams_before_the_reply_ends(any_tokenizer):
    lead_byte = any_tokenizer.convert_tokens_to_ids("ä")  # byte 0xE4 alone: starts a 3-byte character
    ids = [lead_byte] * 40 + any_tokenizer.encode("ok")
    deltas = streamed(any_tokenizer, ids)
    assert "".join(deltas) == any_tokenizer.decode(ids) == REPLACEMENT * 40 + "ok"
    assert "".join(deltas[:40]).count(REPLACEMENT) >= 30  # held at most a few tokens, not to the end


def wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """A BERT-style tokenizer whose decode cleans up spaces: "don ' t" decodes as "don't"."""
    vocab = {word: i for i, word in enumerate(["[UNK]", "don", "'", "t", "stop", "it", "now", "."])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", clean_up_tokenization_spaces=True)


def test_the_reply_keeps_streaming_after_a_decode_rewrites_shown_text():
    """decode("don", "'") is "don '" but decode("don", "'", "t") is "don't": the shown text cannot be
    taken back, and every later token must still show its text."""
    tokenizer = wordpiece_tokenizer()
    ids = tokenizer.encode("don ' t stop it now.")
    assert tokenizer.decode(ids[:2]) == "don '" and tokenizer.decode(ids[:3]) == "don't"
    assert streamed(tokenizer, ids) == ["don", " '", " t", " stop", " it", " now", ".", ""]


class CountingTokenizer:
    """Wraps a tokenizer and counts how many ids it was asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded_ids = 0

    def decode(self, ids, **kwargs):
        self.decoded_ids += len(ids)
        return self.tokenizer.decode(ids, **kwargs)


def test_each_token_decodes_a_short_window_not_the_whole_reply(tokenizer):
    ids = tokenizer.encode(LONG_REPLY)
    counting = CountingTokenizer(tokenizer)
    detok = Detokenizer(counting)
    for i in ids:
        detok.push(i)
    assert len(ids) > 5000
    assert counting.decoded_ids < 8 * len(ids)  # re-decoding the whole reply each time: ~len(ids)²/2
