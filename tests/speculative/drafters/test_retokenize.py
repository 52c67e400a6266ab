"""Between two tokenizers: the committed conversation in the drafter's ids, kept up to date a few ids at a time,
equals encoding the whole text afresh; drafted text becomes the ids it adds after the committed text."""

from __future__ import annotations

import pytest
from text_pairs import OTHER_CORPUS, text_tokenizer
from tiny_models import SPECIALS, build_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from specchat.speculative.drafters.retokenize import TextMirror, continuation_ids, decode, splits_at_lines

TEXT = (
    "<|im_start|>user\nHéllo wörld 😀, how are you?\n    x = [1, 2]\n\n\tfor i in range(10):\n"
    "print(i * i)  # done<|im_end|>\n<|im_start|>assistant\n"
)


def whole(mirror: TextMirror, target_ids: list[int]) -> list[int]:
    text = decode(mirror.target_tokenizer, target_ids)
    return mirror.bos + mirror.drafter_tokenizer(text, add_special_tokens=False)["input_ids"]


def sentencepiece_like() -> PreTrainedTokenizerFast:
    """A tokenizer that puts a space before every text it encodes, as SentencePiece's dummy prefix does, and
    opens it with BOS, as Llama's does."""
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    raw.train_from_iterator(
        OTHER_CORPUS + [TEXT],
        trainers.BpeTrainer(vocab_size=200, special_tokens=["<s>", *SPECIALS], show_progress=False),
    )
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="<|im_end|>")


@pytest.mark.parametrize(
    "drafter_tokenizer",
    [lambda: text_tokenizer(OTHER_CORPUS, 200, every_byte=True), sentencepiece_like],
    ids=["byte-level", "dummy-prefix"],
)
def test_the_mirror_grown_id_by_id_or_cut_back_encodes_as_the_whole_text(drafter_tokenizer):
    target = build_tokenizer()
    mirror = TextMirror(target, drafter_tokenizer())
    ids = target.encode(TEXT)
    assert sum(target.decode(ids[:n]).endswith("\ufffd") for n in range(1, len(ids))) >= 3  # characters cut
    for n in range(1, len(ids) + 1):  # a multi-byte character reads as U+FFFD until its last byte comes
        assert mirror.update(ids[:n]) == whole(mirror, ids[:n]), n
    for cut in (len(ids) - 3, 17, 40, 2):  # a shorter conversation, then one that goes on differently
        assert mirror.update(ids[:cut]) == whole(mirror, ids[:cut])
        other = ids[:cut] + target.encode(" and then something else\nentirely")
        assert mirror.update(other) == whole(mirror, other)
    assert len(mirror.lines) == (2 if mirror.by_line else 1)  # "...else\nentirely": two lines where exact


def test_line_by_line_encoding_is_kept_for_tokenizers_where_it_is_exact():
    assert splits_at_lines(build_tokenizer()) and splits_at_lines(text_tokenizer(OTHER_CORPUS, 200, every_byte=True))
    assert not splits_at_lines(sentencepiece_like())  # "\nfor" and "for" encode differently


def test_a_drafter_that_opens_text_with_bos_reads_it_first_once():
    target, drafter = build_tokenizer(), sentencepiece_like()
    mirror = TextMirror(target, drafter)
    ids = mirror.update(target.encode("Hello"))
    assert ids[0] == drafter.bos_token_id and ids.count(drafter.bos_token_id) == 1
    with_bos = target.encode("<s>Hello")  # the target's text names the drafter's BOS itself
    assert mirror.update(with_bos).count(drafter.bos_token_id) == 1


def test_drafted_text_becomes_the_ids_it_adds_after_the_committed_text():
    tok = build_tokenizer()
    assert (
        continuation_ids(tok, "def reverse", "(lst):")
        == tok.encode("def reverse(lst):")[len(tok.encode("def reverse")) :]
    )
    assert tok.tokenize("def rev")[-1] == "v" and tok.tokenize("def reverse")[-1] == "Ġreverse"
    merged = continuation_ids(tok, "def rev", "erse(lst):")  # " rev" + "erse" is one token: not the committed one
    assert tok.decode(merged) == "erse(lst):" and continuation_ids(tok, "def", "") == []
