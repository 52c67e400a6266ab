"""The acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

Sampling: accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
resample from norm(max(0, p_i - q_i)); if all gamma drafts pass, sample a bonus token from p_{gamma+1}.
Greedy: accept while the draft equals the target's argmax, then emit the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.core.sampling import sample


@dataclass(frozen=True)
class Verdict:
    accepted: int     # how many drafts were accepted (a prefix)
    next_token: int   # the corrected token (accepted < gamma) or the bonus token (accepted == gamma)


def verify_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """drafts [gamma]; target_logits [gamma+1, vocab]. Exact argmax matching, one host sync."""
    choice = target_logits.argmax(dim=-1)  # [gamma+1]
    gamma = drafts.shape[0]
    both = torch.cat([(choice[:gamma] != drafts).to(torch.int64), choice]).tolist()
    mismatches, targets = both[:gamma], both[gamma:]
    accepted = mismatches.index(1) if 1 in mismatches else gamma
    return Verdict(accepted, targets[accepted])


def verify_sampled(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                   generator: torch.Generator) -> Verdict:
    """drafts [gamma]; q [gamma, vocab] drafter probs; p [gamma+1, vocab] target probs."""
    gamma = drafts.shape[0]
    rows = torch.arange(gamma, device=drafts.device)
    p_x = p[rows, drafts]  # [gamma]
    q_x = q[rows, drafts]  # [gamma]
    u = torch.rand(gamma, generator=generator, device=p.device)
    rejected = (u * q_x > p_x).tolist()  # accept iff u < p/q, written without division
    accepted = rejected.index(True) if True in rejected else gamma
    if accepted == gamma:
        return Verdict(gamma, int(sample(p[gamma:gamma + 1], generator)))
    return Verdict(accepted, int(sample(residual(p[accepted], q[accepted]).unsqueeze(0), generator)))


def residual(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over [vocab]; when p == q numerically, p itself."""
    diff = torch.clamp(p_row - q_row, min=0.0)
    total = diff.sum()
    return diff / total if float(total) > 0 else p_row
