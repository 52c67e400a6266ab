"""The `head` drafter: a draft head trained for the target on the user's machine (`specchat train-drafter`), which
drafts from the target's own last hidden state. EAGLE-1's autoregression over features (Li et al. 2024), with an MLP
where EAGLE has a decoder layer: from the target's hidden state f at the token before the newest and the newest
token's embedding e, it predicts the hidden state the target will have at the newest token, f' = f + MLP([f; e]),
reads a draft token from it through the target's own output head (the rows the drafter view scores), and goes on
from f' and that token's embedding.

The target hands it f at no extra pass: the hidden states its verification forward (or a prompt's last chunk) kept
anyway, through Drafter.observe (TargetRows). Where it has no f for the newest position (a prompt read from the
cache alone, a model that keeps none), it drafts nothing and the step is the target's alone. Like every drafter it
only proposes: q is the law it drew from, and the rule keeps the output the target's.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.config import SamplingConfig
from specchat.speculative import model_io
from specchat.speculative.drafters.base import (
    Draft,
    Drafter,
    DrafterSetup,
    DrafterUnusable,
    DraftPlan,
    DraftView,
    TargetRows,
)
from specchat.speculative.drafters.lookup import common_prefix_len
from specchat.speculative.drafters.model import Drafting
from specchat.speculative.drafters.vocab import DraftVocab, head_width
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler
from specchat.speculative.timing import clock

KEPT_STATES = 4096  # the target's hidden states a head drafter keeps (6 KB each at hidden 1536)


class FeatureHead(nn.Module):
    """f' = f + W_out · silu(W_mix · [f; e]): the target's next hidden state from its hidden state f [n, hidden] and
    the embedding e [n, hidden] of the token after it."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.mix = nn.Linear(2 * hidden, width)
        self.out = nn.Linear(width, hidden)

    def forward(self, feature: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        mixed = self.mix(torch.cat([feature, embedded.to(feature.dtype)], dim=-1))
        grown: torch.Tensor = feature + self.out(nn.functional.silu(mixed))
        return grown


class HeadDrafter:
    def __init__(
        self,
        target: model_io.Model,
        head: FeatureHead,
        vocab_size: int,
        sampler: Sampler = TORCH_SAMPLER,
        view: DraftView = DraftView(),
    ) -> None:
        self.target, self.head, self.vocab_size, self.sampler, self.view = target, head, vocab_size, sampler, view
        self.embed = target.get_input_embeddings()
        self.output = target.get_output_embeddings()
        self.width = min(vocab_size, head_width(self.output))
        self.device = model_io.input_device(target)
        self.known: list[int] = []  # the committed ids it last observed
        self.states: dict[int, torch.Tensor] = {}  # position -> the target's hidden state there [1, hidden]
        self._vocab: DraftVocab | None = None

    def reset(self) -> None:
        self.known, self.states, self._vocab = [], {}, None

    def observe(self, ids: list[int], read: int = 0, target: TargetRows | None = None) -> int:
        """Keep the target's hidden states handed over (`target`) while the ids before them hold: a state stands for
        the ids up to its position, so a conversation rolled back (a retry, an edited turn) keeps those of its
        common part, the prompt's last chunk's among them. At most KEPT_STATES, the newest."""
        common = common_prefix_len(self.known, ids)
        self.states = {position: state for position, state in self.states.items() if position < common}
        if target is not None:
            for offset in range(min(target.hidden.shape[0], len(ids) - target.start)):
                self.states[target.start + offset] = target.hidden[offset : offset + 1]
        for position in sorted(self.states)[:-KEPT_STATES]:
            del self.states[position]
        self.known = list(ids)
        return 0

    @torch.inference_mode()
    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """Up to plan.gamma tokens from the target's hidden state at the token before the newest; none without it."""
        drafting = Drafting(plan, sampling, generator, self._draft_vocab(ids), self.sampler, False, ids)
        state = self.states.get(len(ids) - 2) if self.known == ids else None
        if state is None:
            return drafting.draft(self.vocab_size, self.device)
        feature, token = state.float(), torch.tensor([ids[-1]], dtype=torch.long, device=self.device)
        while not drafting.finished:
            start = clock(self.target)
            feature = self.head(feature, self.embed(token).reshape(1, -1))
            drafting.add(self._logits(feature, drafting.vocab))
            drafting.forwards.append((1, clock(self.target) - start))
            if not drafting.ids:  # a row a constraint left empty ended the draft before its first token
                break
            token = drafting.ids[-1]
        return drafting.draft(self.vocab_size, self.device)

    def _logits(self, feature: torch.Tensor, vocab: DraftVocab | None) -> torch.Tensor:
        if vocab is not None:
            return vocab.logits(feature)
        logits: torch.Tensor = self.output(feature)[:, : self.width]
        return logits

    def _draft_vocab(self, ids: list[int]) -> DraftVocab | None:
        if not self.view.vocab_limit or self.view.vocab_limit >= self.width:
            return None
        if self._vocab is None:
            self._vocab = DraftVocab(self.output, self.view.vocab_limit, self.view.always_ids)
        self._vocab.update(ids)
        return self._vocab


def from_setup(setup: DrafterSetup, _: int | None) -> Drafter:
    """The `head` row's constructor (drafters/registry.py): the head loading found trained for this target."""
    head = getattr(setup.target, model_io.DRAFT_HEAD, None)
    if not isinstance(head, FeatureHead):
        raise DrafterUnusable("head: no draft head is trained for this target; train one with `specchat train-drafter`")
    setattr(setup.target, model_io.FEATURES, True)  # a transformers target's caches keep their hidden states too
    return HeadDrafter(setup.target, head, setup.vocab_size, setup.sampler, setup.view)
