"""The pair check (target and drafter must speak the same tokens) and the stop-token set."""
from __future__ import annotations

from specchat.errors import ModelLoadError

# End-of-turn tokens of common chat templates; each counts as a stop token when the tokenizer
# has it as a special token.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
               "<end_of_turn>", "<|end|>", "</s>")


def special_tokens(tokenizer) -> dict[str, int]:
    """Every special token the tokenizer knows, as token -> id."""
    found = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for token in tokenizer.all_special_tokens:
        found.setdefault(token, tokenizer.convert_tokens_to_ids(token))
    return found


def output_width(model) -> int:
    head = model.get_output_embeddings()
    return getattr(head, "out_features", None) or head.weight.shape[0]


def check_pair(target_tok, drafter_tok, drafter_model, target_name: str, drafter_name: str) -> None:
    """The drafter must score every target token id, with the same token behind each shared id."""
    pair = f"target {target_name} and drafter {drafter_name}"
    n = len(target_tok)
    if output_width(drafter_model) < n:
        raise ModelLoadError(f"{pair} do not fit: the drafter scores {output_width(drafter_model)} "
                             f"token ids, the target's tokenizer has {n}; pick a drafter of the same family")
    if drafter_tok is target_tok:
        return  # one tokenizer, read from the same files (shared_tokenizer.py)
    shared = min(n, len(drafter_tok))
    target_ids = target_tok.convert_ids_to_tokens(list(range(shared)))
    drafter_ids = drafter_tok.convert_ids_to_tokens(list(range(shared)))
    for i, (a, b) in enumerate(zip(target_ids, drafter_ids)):
        if a != b:
            raise ModelLoadError(f"{pair} use different tokenizers (id {i} is {a!r} for the target "
                                 f"but {b!r} for the drafter); pick a drafter of the same family")
    _check_specials(special_tokens(target_tok), special_tokens(drafter_tok), pair)


def _check_specials(target: dict[str, int], drafter: dict[str, int], pair: str) -> None:
    for token in sorted(set(target) | set(drafter)):
        if target.get(token) != drafter.get(token):
            raise ModelLoadError(f"{pair} disagree on the special token {token!r} (target id "
                                 f"{target.get(token)}, drafter id {drafter.get(token)}); "
                                 f"pick a drafter of the same family")


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
            raise ModelLoadError(f"speculation.extra_eos: {text!r} is {len(encoded)} tokens for this "
                                 f"tokenizer; each stop string must be exactly one token")
        ids.add(int(encoded[0]))
    return ids
