"""The drafter cut to fewer layers: the view runs exactly the layers kept, the search leaves out the layer that
costs least each round, and each row scores the cut drafter on the held-out replies."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import prompt_ids

from specchat.bench import drafter_layers, drafters
from specchat.config import SamplingConfig
from specchat.loading.models import ModelFacts
from specchat.runtime.lean import attach_lean
from specchat.speculative.drafters.self_layers import layers_view, truncated_model
from specchat.speculative.model_io import forward, new_kv_cache

PROMPT = "def reverse(items):"
CLOSE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def lean_target(target):
    lean = copy.deepcopy(target)
    assert attach_lean(lean) == ""
    return lean


def transformers_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def lean_logits(model, ids):
    return forward(model, new_kv_cache(model), ids, keep=1)[0]


def by_hand(target, ids, layers):
    """Embeddings, the given layers in order, final norm, head: the last position's logits."""
    decoder = target.get_decoder()
    with torch.no_grad():
        hidden = decoder.embed_tokens(torch.tensor([ids]))
        positions = torch.arange(len(ids)).unsqueeze(0)
        rotary = decoder.rotary_emb(hidden, positions)
        mask = torch.full((len(ids), len(ids)), float("-inf")).triu(1)[None, None]
        for index in layers:
            out = decoder.layers[index](hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
            hidden = out[0] if isinstance(out, tuple) else out
        return target.lm_head(decoder.norm(hidden))[0, -1]


def test_a_view_of_chosen_layers_runs_those_layers_alone_and_shares_their_weights(target, lean_target, tokenizer):
    ids = prompt_ids(tokenizer, PROMPT)
    layers = list(lean_target.get_decoder().layers)
    skipping = layers_view(lean_target, [0, 2])
    assert list(skipping.get_decoder().layers) == [layers[0], layers[2]]
    assert lean_target.config.num_hidden_layers == 3  # the model's own config is untouched
    whole, first_two = transformers_logits(target, ids), transformers_logits(truncated_model(target, 2), ids)
    torch.testing.assert_close(by_hand(target, ids, [0, 1, 2]), whole, **CLOSE)  # the by-hand forward is right
    torch.testing.assert_close(lean_logits(layers_view(lean_target, [0, 1, 2]), ids), whole, **CLOSE)
    torch.testing.assert_close(lean_logits(layers_view(lean_target, [0, 1]), ids), first_two, **CLOSE)
    skipped = lean_logits(skipping, ids)
    torch.testing.assert_close(skipped, by_hand(target, ids, [0, 2]), **CLOSE)
    assert not torch.allclose(skipped, whole, atol=1e-3) and not torch.allclose(skipped, first_two, atol=1e-3)


def test_only_the_lean_forward_skips_layers(target):
    assert len(layers_view(target, [0, 1]).get_decoder().layers) == 2  # a prefix runs on transformers too
    with pytest.raises(ValueError, match="lean forward only"):
        layers_view(target, [0, 2])


def test_each_round_leaves_out_the_inner_layer_whose_absence_scores_highest():
    cost = {1: 0.3, 2: 0.1, 3: 0.2, 4: 0.05, 5: 0.4}  # what leaving each inner layer out costs; 0 and 6 never go
    score = lambda keep: 1.0 - sum(c for layer, c in cost.items() if layer not in keep)
    rounds = list(drafter_layers.leave_out(7, 3, score))
    assert [left for left, _, _ in rounds] == [4, 2, 3]
    assert rounds[-1][1] == [0, 1, 5, 6]
    assert [round(s, 6) for _, _, s in rounds] == [0.95, 0.85, 0.65]
    assert len(list(drafter_layers.leave_out(4, 9, score))) == 2  # the first and the last stay


def test_rows_score_the_cut_drafter_on_the_held_out_replies(lean_target, tokenizer):
    sampled = SamplingConfig(temperature=0.7, top_p=0.9)
    facts = ModelFacts("tiny", "tiny", 0, "float32", "none", "cpu", 0, 0.0)
    prompts = [tokenizer.encode("def reverse(lst):"), tokenizer.encode("Hello, how are you")]
    replies = drafters.target_replies(drafters.Target(lean_target, tokenizer, facts), prompts, 8, sampled)
    lines = []
    context = tokenizer.encode("def reverse(lst): return lst[::-1]\n" * 40)  # T(1) is timed past 256 tokens
    rows = drafter_layers.cut_rows(lean_target, len(tokenizer), replies[:1], replies[1:], 1, context, lines.append)
    assert [row["layers"] for row in rows] == [3, 2] and rows[1]["left_out"] == [1]  # only layer 1 may go
    assert rows[0]["greedy"] == 1.0 and rows[0]["search"] == 1.0  # the whole target agrees with itself
    expected = drafters.agreement(replies[1:], layers_view(lean_target, [0, 2]), len(tokenizer), sampled)
    assert (rows[1]["greedy"], rows[1]["sampled"]) == pytest.approx(expected)
    assert rows[1]["t1_ms"] > 0 and "2 layers (without layers 1)" in lines[1] and "every layer" in lines[0]


@pytest.mark.parametrize("argv", [["--drop", "0"], ["--max-new-tokens", "0"]])
def test_bad_arguments_get_one_line_and_status_2(argv, capsys):
    assert drafter_layers.main(argv) == 2
    assert "must be 1 or more" in capsys.readouterr().err
