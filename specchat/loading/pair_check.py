"""The pair check: how a drafter's tokens relate to its target's, as a verdict the banner prints in one line.

- same: one tokenizer; the drafter drafts the target's ids.
- padded: the same tokens, but one vocabulary is padded wider than the other by at most PAD_LIMIT ids (Qwen's
  7B+ files have 152,064 rows, the small ones 151,936; llama.cpp accepts a difference of up to 128). The
  drafter drafts the target's ids below its own width; the ids past it are never drafted, and the target
  still scores all of its own, so the output stays exactly the target's.
- text: different tokenizers (or padding wider than PAD_LIMIT). The drafter drafts text, which is
  re-tokenized into the target's ids and proposed one-hot (speculative/drafters/text.py): exact as well.

Whether BOS, EOS and the chat template agree is said, not enforced: stop tokens and the template are the
target's either way, so a difference costs acceptance only.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.errors import ModelLoadError
from specchat.speculative.drafters.vocab import head_width

PAD_LIMIT = 128


@dataclass(frozen=True)
class PairCheck:
    kind: str  # same | padded | text
    target_ids: int  # ids of the target's tokenizer (what the target scores and verifies)
    drafter_ids: int  # ids of the drafter's tokenizer
    drafter_width: int  # ids the drafter's head scores
    difference: str = ""  # the first id whose token differs, in words ("" where none does)
    specials: str = ""  # what differs among BOS and EOS, in words ("" where they agree)
    template: bool = True  # the chat templates are the same

    @property
    def text_drafting(self) -> bool:
        return self.kind == "text"

    def line(self) -> str:
        """The verdict in one line, for the banner."""
        agree = [
            self.specials or "BOS/EOS agree",
            "chat template agrees" if self.template else "chat templates differ (the target's is used)",
        ]
        return "pair: " + " · ".join([self._tokens(), *agree])

    def _tokens(self) -> str:
        if self.kind == "same":
            return f"one tokenizer ({self.target_ids:,} ids)"
        if self.kind == "padded":
            draftable = min(self.target_ids, self.drafter_width)
            past = f"; target ids past {draftable:,} never drafted" if draftable < self.target_ids else ""
            return (
                f"one tokenizer, vocabularies padded apart (target {self.target_ids:,} ids, drafter "
                f"{self.drafter_ids:,}, its head {self.drafter_width:,}{past})"
            )
        why = self.difference or (
            f"{self.target_ids:,} and {self.drafter_ids:,} ids, padded apart by more than {PAD_LIMIT}"
        )
        return f"different tokenizers ({why}): the drafter drafts text, re-tokenized into the target's ids (exact)"


def judge_pair(target_tok, drafter_tok, drafter_model, drafter_name: str) -> PairCheck:
    """The verdict on a target's tokenizer and a drafter (its tokenizer and model). Refuses only a drafter
    whose head scores far fewer ids than its own tokenizer has: that checkpoint is inconsistent."""
    width = head_width(drafter_model.get_output_embeddings())
    if width < len(drafter_tok) - PAD_LIMIT:
        raise ModelLoadError(
            f"drafter {drafter_name} scores {width} token ids but its tokenizer has "
            f"{len(drafter_tok)}; the checkpoint is inconsistent"
        )
    difference = "" if same_vocabulary(target_tok, drafter_tok) else first_difference(target_tok, drafter_tok)
    sizes = (len(target_tok), len(drafter_tok), width)
    return PairCheck(
        _kind(difference, *sizes),
        *sizes,
        difference,
        _specials(target_tok, drafter_tok),
        getattr(target_tok, "chat_template", None) == getattr(drafter_tok, "chat_template", None),
    )


def _kind(difference: str, target_ids: int, drafter_ids: int, width: int) -> str:
    if difference:
        return "text"
    padding = max(target_ids - width, abs(target_ids - drafter_ids))
    if padding == 0:
        return "same"
    return "padded" if padding <= PAD_LIMIT else "text"


def same_vocabulary(target_tok, drafter_tok) -> bool:
    """Whether the two are one tokenizer, or copies sharing one backend (shared_tokenizer.with_template)."""
    backend = getattr(target_tok, "backend_tokenizer", None)
    return drafter_tok is target_tok or (
        backend is not None and getattr(drafter_tok, "backend_tokenizer", None) is backend
    )


def first_difference(target_tok, drafter_tok) -> str:
    """The first id below both sizes whose token differs, in words; "" where every such id agrees."""
    shared = min(len(target_tok), len(drafter_tok))
    target_tokens = target_tok.convert_ids_to_tokens(list(range(shared)))
    drafter_tokens = drafter_tok.convert_ids_to_tokens(list(range(shared)))
    for i, (a, b) in enumerate(zip(target_tokens, drafter_tokens)):
        if a != b:
            return f"id {i} is {a!r} for the target, {b!r} for the drafter"
    return ""


def _specials(target_tok, drafter_tok) -> str:
    """What differs among BOS and EOS, in words ("" where both agree)."""
    differ = [
        f"{name.upper()} differs ({getattr(target_tok, f'{name}_token', None)!r} / "
        f"{getattr(drafter_tok, f'{name}_token', None)!r})"
        for name in ("bos", "eos")
        if getattr(target_tok, f"{name}_token", None) != getattr(drafter_tok, f"{name}_token", None)
    ]
    return ", ".join(differ)
