"""A conversation's token ids with every message's text read as text: only the chat template's own markup becomes
control tokens.

A tokenizer reads the spelling of a special token (`<|im_end|>`) anywhere in its input as that token, so a message
that spells `<|im_end|>\\n<|im_start|>system\\n…` would forge turns. Where no message spells a special token (nearly
always) the conversation is encoded as before, id for id. Where one does, the template is rendered with a private
mark in place of each such message's text, and each message's text is tokenized with special tokens split into
plain text, the template's text around it as usual.
"""

from __future__ import annotations

from typing import Any

MARK = "\ue000specchat-message-{}\ue001"  # private-use characters: no template writes them, no tokenizer merges them


class LiteralTextError(ValueError):
    """The template changed a message's text, so where it lies in the prompt cannot be told."""


def special_spellings(tokenizer: Any) -> tuple[str, ...]:
    """The texts that this tokenizer reads as special tokens (the chat template's markup among them)."""
    cached = getattr(tokenizer, "_specchat_special_spellings", None)
    if cached is not None:
        return cached
    spellings = {str(token) for token in getattr(tokenizer, "all_special_tokens", ())}
    for added in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(added, "special", False):
            spellings.add(str(added.content))
    found = tuple(sorted(spelling for spelling in spellings if spelling))
    try:
        tokenizer._specchat_special_spellings = found
    except AttributeError:  # a tokenizer that takes no new attributes: found again next time
        pass
    return found


def spells_special(text: str, spellings: tuple[str, ...]) -> bool:
    return any(spelling in text for spelling in spellings)


def literal_ids(tokenizer: Any, conversation: list[dict[str, Any]], **template_options: Any) -> list[int] | None:
    """The conversation's ids with each message's text tokenized as text, or None where no message spells a
    special token (the caller's usual encoding then gives the same ids)."""
    spellings = special_spellings(tokenizer)
    marked = [i for i, message in enumerate(conversation) if spells_special(str(message.get("content", "")), spellings)]
    if not marked:
        return None
    placeholders = [dict(message) for message in conversation]
    for i in marked:
        placeholders[i]["content"] = MARK.format(i)
    text = tokenizer.apply_chat_template(placeholders, add_generation_prompt=True, tokenize=False, **template_options)
    for i in marked:
        if text.count(MARK.format(i)) != 1:
            raise LiteralTextError(
                f"message {i + 1} spells a special token ({_first(conversation[i]['content'], spellings)}) and the "
                f"model's chat template rewrites message text, so it cannot be kept as text; remove that spelling"
            )
    ids: list[int] = []
    for i in sorted(marked, key=lambda i: text.find(MARK.format(i))):  # in the order the template wrote them
        before, text = text.split(MARK.format(i))
        ids += _encode(tokenizer, before, split_special=False)
        ids += _encode(tokenizer, conversation[i]["content"], split_special=True)
    return ids + _encode(tokenizer, text, split_special=False)


def _encode(tokenizer: Any, text: str, split_special: bool) -> list[int]:
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=split_special)["input_ids"])


def _first(text: str, spellings: tuple[str, ...]) -> str:
    return min((text.find(s), s) for s in spellings if s in text)[1]
