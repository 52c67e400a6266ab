"""The acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

Sampling: accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
resample from norm(max(0, p_i - q_i)); if all gamma drafts pass, sample a bonus token from p_{gamma+1}.
Greedy: accept while the draft equals the target's argmax, then emit the target's argmax.

Both rules run on the device and read nothing back: the verdict's numbers are 0-dim tensors there, which the
step reads back with the rest of what it needs, in one transfer (step.py, readback.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.speculative.sampling import sample


@dataclass(frozen=True)
class Verdict:
    accepted: int | torch.Tensor  # how many drafts were accepted (a prefix); an int or a 0-dim tensor
    next_token: int | torch.Tensor  # the corrected token (accepted < gamma) or the bonus token (accepted == gamma)


def first_refusal(refused: torch.Tensor) -> torch.Tensor:
    """The index of the first True in a [gamma] bool tensor, gamma when there is none (0-dim, on its device)."""
    end = torch.ones(1, dtype=torch.bool, device=refused.device)
    return torch.cat([refused, end]).to(torch.int64).argmax()  # argmax returns the first of equal maxima


def verify_greedy(drafts: torch.Tensor, target_logits: torch.Tensor, choice: torch.Tensor | None = None) -> Verdict:
    """drafts [gamma]; target_logits [gamma+1, vocab]. Exact argmax matching; `choice`: the rows' argmax [gamma+1]
    where the caller has it already (a GreedyFn's), else taken here."""
    choice = target_logits.argmax(dim=-1) if choice is None else choice  # [gamma+1]
    gamma = drafts.shape[0]
    accepted = first_refusal(choice[:gamma] != drafts)
    return Verdict(accepted, choice.gather(0, accepted.view(1)).view(()))


def verify_sampled(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator) -> Verdict:
    """drafts [gamma]; q [gamma, vocab] drafter probs; p [gamma+1, vocab] target probs."""
    gamma = drafts.shape[0]
    rows = torch.arange(gamma, device=drafts.device)
    p_x = p[rows, drafts]  # [gamma]
    q_x = q[rows, drafts]  # [gamma]
    u = torch.rand(gamma, generator=generator, device=p.device)
    # accept iff u < p/q, written without division and so that NaN refuses: a comparison with NaN is false, and a
    # drafter whose q is NaN must not pass its drafts (the residual below then falls back to p itself)
    accepted = first_refusal(~(u * q_x <= p_x))
    return Verdict(accepted, sample(_next_row(p, q, accepted, gamma).unsqueeze(0), generator)[0])


def _next_row(p: torch.Tensor, q: torch.Tensor, accepted: torch.Tensor, gamma: int) -> torch.Tensor:
    """What the next token is drawn from: p[gamma] when every draft passed (the bonus token), else the
    residual at the first refused draft. [vocab]"""
    p_row = p.index_select(0, accepted.view(1))[0]
    if gamma == 0:
        return p_row
    q_row = q.index_select(0, accepted.clamp(max=gamma - 1).view(1))[0]
    return torch.where(accepted == gamma, p_row, residual(p_row, q_row))


def residual(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over [vocab]; when p == q numerically, p itself."""
    diff = torch.clamp(p_row - q_row, min=0.0)
    total = diff.sum()
    return torch.where(total > 0, diff / total, p_row)
