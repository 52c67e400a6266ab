"""The OpenAI request fields that change the target's logits by rule, as rules of speculative/constraint.py:
`logit_bias` (a fixed amount added to chosen tokens' logits) and `frequency_penalty` (subtracted once for each time a
token already appears in the reply). Both read only the context, so speculation stays exact for the law they make."""

from __future__ import annotations

from collections import Counter

import torch


class LogitBias:
    def __init__(self, bias: dict[int, float]):
        self.ids = torch.tensor(sorted(bias), dtype=torch.long)
        self.amounts = torch.tensor([bias[i] for i in sorted(bias)], dtype=torch.float32)

    def apply(self, logits: torch.Tensor, contexts: list[list[int]]) -> torch.Tensor:
        out = logits.float().clone()
        inside = self.ids < out.shape[-1]
        out[:, self.ids[inside].to(out.device)] += self.amounts[inside].to(out.device)
        return out


class FrequencyPenalty:
    """OpenAI's frequency penalty over the reply's own tokens (the ids after the first `start`)."""

    def __init__(self, penalty: float, start: int):
        self.penalty, self.start = penalty, start

    def apply(self, logits: torch.Tensor, contexts: list[list[int]]) -> torch.Tensor:
        out = logits.float().clone()
        width = out.shape[-1]
        for row, context in enumerate(contexts):
            counts = Counter(i for i in context[self.start :] if 0 <= i < width)
            if counts:
                ids = torch.tensor(list(counts), dtype=torch.long, device=out.device)
                times = torch.tensor(list(counts.values()), dtype=out.dtype, device=out.device)
                out[row, ids] -= self.penalty * times
        return out
