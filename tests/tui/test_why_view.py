"""tui/why_view.py: /why's detail of one rejection names as many top tokens as it lists."""

from __future__ import annotations

import torch
from rich.console import Console

from specchat.config import SamplingConfig
from specchat.speculative.insight import rejection_at
from specchat.speculative.sampling import probs_from_logits
from specchat.tui.why_view import rejection_detail


def test_the_detail_names_as_many_tokens_as_it_lists(tokenizer):
    logits = torch.full((1, 50), -20.0)
    logits[0, [7, 9, 3]] = torch.tensor([2.0, 1.8, 0.5])
    probs = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.6))  # a nucleus of 7 and 9
    rejection = rejection_at(0, 0, drafted=3, emitted=7, logits=logits, probs=probs, q=0.9, drafter_best=None)
    console = Console(width=100, record=True)
    console.print(rejection_detail(tokenizer, 1, rejection))
    shown = console.export_text()
    assert "target top 2" in shown and "drafter top 1" in shown and "top 5" not in shown
