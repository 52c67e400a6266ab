"""The stop-token set, and the pair check for tools that compare a drafter with its target id by id."""

from __future__ import annotations

from specchat.errors import ModelLoadError
from specchat.loading.pair_check import judge_pair
from specchat.speculative.drafters.retokenize import special_tokens
from specchat.speculative.drafters.vocab import head_width

# End-of-turn tokens of common chat templates; each counts as a stop token when the tokenizer
# has it as a special token.
END_OF_TURN = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)


def output_width(model) -> int:
    return head_width(model.get_output_embeddings())


def check_pair(target_tok, drafter_tok, drafter_model, target_name: str, drafter_name: str) -> None:
    """The drafter must draft in the target's ids (one tokenizer, or padded apart: pair_check.py), as a tool
    that compares the two models' probabilities id by id needs (bench.drafters)."""
    verdict = judge_pair(target_tok, drafter_tok, drafter_model, drafter_name)
    if verdict.text_drafting:
        raise ModelLoadError(
            f"target {target_name} and drafter {drafter_name} use different tokenizers "
            f"({verdict.difference or 'padded apart'}); pick a drafter of the same family"
        )


def stop_ids(tokenizer, generation_eos, extra_eos: tuple = ()) -> set[int]:
    """eos + end-of-turn special tokens + the model's generation eos ids + configured extras."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    specials = special_tokens(tokenizer)
    ids.update(specials[t] for t in END_OF_TURN if t in specials)
    if generation_eos is not None:
        ids.update(int(i) for i in ([generation_eos] if isinstance(generation_eos, int) else generation_eos))
    for text in extra_eos:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ModelLoadError(
                f"speculation.extra_eos: {text!r} is {len(encoded)} tokens for this "
                f"tokenizer; each stop string must be exactly one token"
            )
        ids.add(int(encoded[0]))
    return ids
