"""Logits -> probabilities, applied identically to target (p) and drafter (q). Pure tensor code.

Nothing here edits its input in place: logits that are reused stay intact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from specchat.config import SamplingConfig


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


PENALTY_WINDOW = 64  # the ids a repeat or presence penalty looks back over (llama.cpp's repeat_last_n)


def penalize(logits: torch.Tensor, contexts: list[list[int]], params: SamplingConfig) -> torch.Tensor:
    """[n, vocab] logits with llama.cpp's repeat and presence penalties, row r for the ids of contexts[r] (what came
    before its token): each id among the last PENALTY_WINDOW has its logit divided by repeat_penalty where it is
    positive, multiplied where it is not, then presence_penalty subtracted. The logits as they are when neither is
    set; never in place."""
    if not params.penalized:
        return logits
    out = logits.float().clone()
    width = out.shape[-1]
    for row, context in enumerate(contexts):
        seen = torch.tensor(sorted({i for i in context[-PENALTY_WINDOW:] if 0 <= i < width}), dtype=torch.long)
        if not len(seen):
            continue
        values = out[row, seen.to(out.device)]
        shrunk = torch.where(values > 0, values / params.repeat_penalty, values * params.repeat_penalty)
        out[row, seen.to(out.device)] = shrunk - params.presence_penalty
    return out


SMALLEST_TEMPERATURE = torch.finfo(torch.float32).tiny  # a float32 division by less gives inf or nan


def probs_from_logits(logits: torch.Tensor, params: SamplingConfig) -> torch.Tensor:
    """[n, vocab] logits -> [n, vocab] float32 probabilities after temperature, top-k, top-p, min-p (in
    transformers' order).

    Greedy (temperature 0 or greedy=True) gives one-hot argmax rows. The torch code: the default Sampler's.
    """
    logits = logits.float()
    if params.is_greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    temperature = max(params.temperature, SMALLEST_TEMPERATURE)
    # the best logit of each row moves to 0 first (the softmax is the same), so a tiny temperature sends the others
    # to -inf and never the best to inf (inf - inf = nan); below float32's least normal number the law is one-hot
    best = logits.amax(dim=-1, keepdim=True)  # [n, 1]
    scaled = (logits - best) / temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        scaled = _mask_top_p(scaled, params.top_p)
    if params.min_p > 0.0:  # the best scaled logit is 0: a token min_p times as likely as it has log(min_p)
        scaled = scaled.masked_fill(scaled < math.log(params.min_p), float("-inf"))
    return torch.softmax(scaled, dim=-1)


def greedy_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch code of a greedy row: argmax and logsumexp, each a pass of its own (several within logsumexp)."""
    scores = logits.float()
    return scores.argmax(dim=-1), torch.logsumexp(scores, dim=-1)


class TopPProbs(Protocol):
    """The compiled f(logits, temperature, top_k, top_p) -> probabilities (kernels/sampling.cpp)."""

    def __call__(self, logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor: ...


class Sampler:
    """What turns logits into laws and tokens, the one code for the target's p and the drafter's q: a row's
    probabilities after temperature, top-k and top-p; a greedy row's argmax and log-sum-exp (for each token's p);
    and a pick. This class is the torch code; loading chooses the pair's sampler (CompiledSampler where a model runs
    on the compiled module) and the engine gives it once to its step and its drafters."""

    def probs(self, logits: torch.Tensor, params: SamplingConfig) -> torch.Tensor:
        """[n, vocab] logits -> [n, vocab] float32 probabilities (probs_from_logits)."""
        return probs_from_logits(logits, params)

    def greedy(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, vocab] logits -> ([n] argmax ids, the first of equal maxima; [n] their log-sum-exp), on their device."""
        return greedy_rows(logits)

    def pick(
        self, logits: torch.Tensor, params: SamplingConfig, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next id from [1, vocab] logits: (id [1], probabilities [1, vocab], or None when greedy)."""
        if params.is_greedy:
            return logits.argmax(dim=-1), None
        probs = self.probs(logits, params)
        return sample(probs, generator), probs


TORCH_SAMPLER = Sampler()


@dataclass(frozen=True)
class CompiledSampler(Sampler):
    """A Sampler whose sampled CPU rows take a compiled f(logits, temperature, top_k, top_p) (kernels/sampling.cpp:
    one pass over a row, where the torch code takes ten): the same kept tokens, and probabilities within float
    rounding of probs_from_logits (a token whose mass before it is within rounding of top_p may fall either side).
    Greedy rows, other devices and other shapes take the torch code. Its greedy rows take the compiled
    greedy_rows where one is given (two passes over a CPU row: the same ids as torch's argmax, log-sum-exps within
    float rounding of torch's)."""

    top_p_probs: TopPProbs
    native_greedy: Callable[[torch.Tensor], list[torch.Tensor]] | None = None

    def probs(self, logits: torch.Tensor, params: SamplingConfig) -> torch.Tensor:
        if params.is_greedy or params.min_p > 0.0 or logits.device.type != "cpu" or logits.dim() != 2:
            return probs_from_logits(logits, params)
        temperature = max(params.temperature, SMALLEST_TEMPERATURE)
        return self.top_p_probs(logits.float(), temperature, params.top_k, params.top_p)

    def greedy(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.native_greedy is None or logits.device.type != "cpu" or logits.dim() != 2:
            return greedy_rows(logits)
        ids, totals = self.native_greedy(logits.float())
        return ids, totals


TOP_P_CANDIDATES = 128  # the nucleus is looked for among this many tokens first (8× more if needed)


def _mask_top_p(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the highest-probability tokens until their mass reaches top_p, and any token tied with
    the last one kept (so the set never depends on how a sort orders ties).

    A full sort of a 152k vocabulary costs about 7 ms a row on a CPU; a nucleus is almost always far
    smaller, so it is found among the top TOP_P_CANDIDATES first, widening only when it reaches their end
    (the top 128 of five 152k rows: 0.8 ms here; the top 1024: 2.3 ms).
    """
    probs = torch.softmax(scaled, dim=-1)
    width = scaled.shape[-1]
    k = min(TOP_P_CANDIDATES, width)
    while True:
        top = torch.topk(probs, k, dim=-1).values  # [n, k], descending
        mass_before = torch.cumsum(top, dim=-1) - top
        # [n, 1]; at least 1: a top_p below float32's least subnormal (1e-320) rounds to 0 in the comparison
        kept = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
        if k == width or bool((kept < k).all()):
            break
        k = min(width, k * 8)  # some row's nucleus may reach past the candidates
    threshold = top.gather(-1, kept - 1)  # [n, 1] probability of the last token kept
    return scaled.masked_fill(probs < threshold, float("-inf"))


class NoLawError(ValueError):
    """The target's probabilities were not a distribution (its logits were NaN, +inf or all -inf)."""

    def __init__(self) -> None:
        super().__init__(
            "the target's probabilities for the next token are not a distribution (its logits were "
            "NaN, +inf or all -inf): no token can be drawn"
        )


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one id per row of [n, vocab] probs -> [n] int64: the first id whose cumulative probability
    (in float64) passes u · total, u uniform in [0, 1). An id of probability 0 is never drawn.
    torch.multinomial takes about 5 ms for one draw from a 152k vocabulary on a CPU; this about 0.5.
    A row of NaN (what +inf, all -inf or NaN logits give, in the torch code and the compiled one alike) draws the
    last id here, with no read to the host; the step that reads its p back refuses it (NoLawError, step.py)."""
    cumulative = torch.cumsum(probs.double(), dim=-1)  # [n, vocab]
    total = cumulative[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, generator=generator, device=probs.device)
    # below the total, so some id's cumulative passes it, and the first that does has probability > 0
    threshold = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    drawn = torch.searchsorted(cumulative, threshold, right=True).squeeze(-1)
    return drawn.clamp(max=probs.shape[-1] - 1)
