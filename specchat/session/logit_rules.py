"""The OpenAI request fields that change the target's logits by rule, as rules of speculative/constraint.py:
`logit_bias` (a fixed amount added to chosen tokens' logits) and `frequency_penalty` (subtracted once for each time a
token already appears in the reply). Both read only the context, so speculation stays exact for the law they make.
`top_logprobs` rides the same hook to read the law each step's rows were drawn from, changing nothing."""

from __future__ import annotations

from collections import Counter

import torch

from specchat.config import SamplingConfig
from specchat.speculative.sampling import probs_from_logits


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


class TopLogprobs:
    """Not a change of the law but a reading of it: for each step (one call a step, in order), the `count` likeliest
    tokens of each row under the law the reply is drawn from (greedy: the softmax of the logits; sampled: the
    sampling settings' law), as (id, log p). The last rule, so that it reads the law the others made; a drafter
    leaves it out (`reads_only`)."""

    reads_only = True

    def __init__(self, count: int, sampling: SamplingConfig):
        self.count, self.sampling = count, sampling
        self.steps: list[list[list[tuple[int, float]]]] = []  # step -> row -> [(id, log p)]

    def apply(self, logits: torch.Tensor, contexts: list[list[int]]) -> torch.Tensor:
        law = logits.float()
        if self.sampling.is_greedy:
            logp = torch.log_softmax(law, dim=-1)
        else:
            logp = torch.log(probs_from_logits(law, self.sampling))
        values, ids = torch.topk(logp, min(self.count, logp.shape[-1]), dim=-1)
        self.steps.append(
            [list(zip(row_ids, row_values)) for row_ids, row_values in zip(ids.tolist(), values.tolist())]
        )
        return logits

    def at(self, step: int, position: int) -> list[tuple[int, float]]:
        """The alternatives of the token at `position` of step `step` ([] where none was read)."""
        if 0 <= step < len(self.steps) and 0 <= position < len(self.steps[step]):
            return self.steps[step][position]
        return []
