"""JSON mode: a reply held to a JSON schema (or to any JSON object) by masking the target's law, token by token.

The mask comes from llguidance (the Rust token-mask engine behind Guidance, used by vLLM, SGLang and llama.cpp),
chosen over xgrammar because its wheel depends on nothing (no torch build to match), its matcher rolls back any
number of tokens and tries a run of them at once (what per-row masks over a step's drafts need), and its JSON
options bound the whitespace a model may write between tokens. One matcher follows one reply: for each
row the step asks about, it is rolled back to the longest prefix it shares with that row's context and fed the
rest, then asked for the next token's mask. Rows after a draft the grammar refuses are never used, and allow all.
Each of the engine's end-of-turn ids is allowed where the grammar allows its end.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

SCHEMA_CHARS = 64 * 1024  # of a schema's JSON
# Whitespace between tokens as a model writes it (newlines, indentation), bounded: a run of it never fills a reply.
# A schema's own "x-guidance" options replace these.
LAYOUT = {"whitespace_pattern": "[ \\t\\n\\r]{0,32}"}
_TOKENIZERS: dict[int, Any] = {}  # llguidance's view of a tokenizer, built once per tokenizer object
_BUILDING = threading.Lock()
SHIFTS = torch.arange(32, dtype=torch.int32)  # a mask word's bits, low first


class SchemaError(ValueError):
    """A schema llguidance cannot compile (its own words), or one too large."""


def grammar_for(schema: dict[str, Any] | None) -> str:
    """The grammar of a JSON schema (None: any JSON object); SchemaError where it cannot be compiled."""
    import json

    import llguidance

    wanted = {"x-guidance": LAYOUT, **(schema if schema is not None else {"type": "object"})}
    if len(json.dumps(wanted)) > SCHEMA_CHARS:
        raise SchemaError(f"the schema is over {SCHEMA_CHARS:,} characters of JSON")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(wanted)
    except (ValueError, TypeError, RuntimeError) as err:
        raise SchemaError(f"the JSON schema cannot be used: {' '.join(str(err).split())[:200]}") from None
    failed, problems = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)  # (is it an error, the words)
    if failed:
        raise SchemaError(f"the JSON schema cannot be used: {' '.join('; '.join(problems).split())[:200]}")
    return grammar


def guidance_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of `tokenizer` (its byte-level vocabulary), built once."""
    import llguidance.hf

    with _BUILDING:
        if id(tokenizer) not in _TOKENIZERS:
            _TOKENIZERS[id(tokenizer)] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer))
        return _TOKENIZERS[id(tokenizer)][1]


class JsonConstraint:
    """The grammar's mask after each context, for one reply whose prompt is the first `start` ids (a rule of
    speculative/constraint.py)."""

    def __init__(self, tokenizer: Any, grammar: str, start: int, eos_ids: set[int] | frozenset[int]):
        import llguidance

        self.guide = guidance_tokenizer(tokenizer)
        self.matcher = llguidance.LLMatcher(self.guide, grammar)
        self.start = start
        self.end_ids = sorted(eos_ids)
        self.consumed: list[int] = []

    def apply(self, logits: torch.Tensor, contexts: list[list[int]]) -> torch.Tensor:
        """The logits with every token the grammar refuses after its row's context at -inf."""
        allowed = self.allowed(contexts, logits.shape[-1]).to(logits.device)
        return logits.masked_fill(~allowed, float("-inf"))

    def allowed(self, contexts: list[list[int]], width: int) -> torch.Tensor:
        """[len(contexts), width] bool: the tokens the grammar allows after each context."""
        words = torch.full((len(contexts), (self.guide.vocab_size + 31) // 32), -1, dtype=torch.int32)  # all allowed
        for row, context in enumerate(contexts):
            if self._follow(context[self.start :]):  # the grammar's mask written into the row's words
                self.matcher.unsafe_compute_mask_ptr(words[row].data_ptr(), words.shape[1] * 4)
        bits = ((words.unsqueeze(-1) >> SHIFTS) & 1).view(len(contexts), -1).bool()
        rows = torch.zeros(len(contexts), width, dtype=torch.bool)
        known = min(width, bits.shape[1])
        rows[:, :known] = bits[:, :known]
        ends = [end for end in self.end_ids if end < width]
        if ends and self.guide.eos_token < bits.shape[1]:
            rows[:, ends] = bits[:, self.guide.eos_token : self.guide.eos_token + 1]
        return rows

    def _follow(self, reply: list[int]) -> bool:
        """Bring the matcher to the end of `reply`; False where the grammar refuses one of its tokens."""
        reply = [self.guide.eos_token if token in self.end_ids else token for token in reply]
        shared = 0
        for mine, theirs in zip(self.consumed, reply):
            if mine != theirs:
                break
            shared += 1
        if len(self.consumed) > shared:
            self.matcher.rollback(len(self.consumed) - shared)
            del self.consumed[shared:]
        rest = reply[shared:]
        taken = self.matcher.try_consume_tokens(rest) if rest else 0
        self.consumed += rest[:taken]
        return taken == len(rest)
