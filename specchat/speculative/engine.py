"""The engine a chat, the API and the bench run replies on: its parts, and a reply as a stream of events.

Its parts, in the order a reply meets them (docs/how-it-works.md): the drafters it holds and their view
(drafter_set.py); the committed sequence and the target's KV cache (conversation.py); the reply's loop of plan,
step and commit (reply.py, step.py, commit.py); the events the UI reads (events.py). A new prompt that extends the
conversation reuses both models' caches up to the common prefix.

`steps()` yields each StepResult (token ids, origins, rejected drafts) and a final ReplyEnd, with no text;
`stream()` wraps it with detokenized text for the UI (mlx-lm's split).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Iterator

from specchat.config import Mode, SamplingConfig, SpeculationConfig
from specchat.speculative import model_io
from specchat.speculative.constraint import Constraint
from specchat.speculative.conversation import Conversation
from specchat.speculative.detok import Detokenizer, Tokenizer
from specchat.speculative.drafter_set import DrafterSet
from specchat.speculative.drafters.base import CachedDrafter, Drafter, DraftView
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.drafters.text import drafter_for
from specchat.speculative.events import Event, PrefillProgress, ReplyDone, ReplyEnd, step_events
from specchat.speculative.gamma import AutoGamma, GammaPolicy
from specchat.speculative.model_io import Model
from specchat.speculative.pair import Pair
from specchat.speculative.reply import Item, run_reply
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler


class Engine:
    """Build one with Engine.for_pair (the chat, compare, the API, the bench) or fork() an engine to rerun on
    its models; the constructor is the primitive under both."""

    def __init__(
        self,
        target: Model,
        tokenizer: Tokenizer,
        drafter: CachedDrafter | None,
        eos_ids: Iterable[int],
        vocab_size: int | None = None,
        policy: GammaPolicy | None = None,
        sampler: Sampler = TORCH_SAMPLER,
    ) -> None:
        self.target, self.tokenizer = target, tokenizer
        self.sampler = sampler  # what computes p and q (sampling.py): chosen where the pair is loaded
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.vocab_size = vocab_size or len(tokenizer)
        self.device = model_io.input_device(target)
        self.policy: GammaPolicy = policy if policy is not None else AutoGamma()
        self.drafters = DrafterSet(target, drafter, self.eos_ids, self.vocab_size, sampler)
        self.conversation = Conversation(target)

    @classmethod
    def for_pair(cls, pair: Pair, with_drafter: bool = True, policy: GammaPolicy | None = None) -> Engine:
        """An Engine (with its own caches and a fresh gamma policy unless given) on a pair's models (a loaded pair
        is one): the drafter that fits the pair, and the sampler loading chose for it."""
        drafter = None
        if with_drafter and pair.drafter is not None:
            view = DraftView(always_ids=frozenset(int(i) for i in pair.eos_ids))  # the settings' defaults
            drafter = drafter_for(
                pair.drafter, pair.vocab_size, pair.tokenizer, pair.drafter_tokenizer, pair.sampler, view
            )
        return cls(pair.target, pair.tokenizer, drafter, pair.eos_ids, pair.vocab_size, policy, pair.sampler)

    def fork(self) -> Engine:
        """An engine on the same models with caches of its own and a copy of this one's gamma policy."""
        forked = Engine(self.target, self.tokenizer, None, self.eos_ids, self.vocab_size, None, self.sampler)
        forked.drafters, forked.policy = self.drafters.fork(), copy.deepcopy(self.policy)
        return forked

    def use_policy(self, policy: GammaPolicy) -> None:
        """Plan auto gamma with `policy` from the next step on (a fresh AutoGamma: learn the costs afresh)."""
        self.policy = policy

    @property
    def drafter(self) -> Drafter | None:
        """The drafter that drafts; None before any has, with no drafter model."""
        return self.drafters.current

    @property
    def has_model_drafter(self) -> bool:
        return self.drafters.model is not None

    def drafter_problem(self, name: str) -> str | None:
        """Why drafter `name` cannot draft here; None where it can."""
        return self.drafters.problem(name)

    @property
    def ids(self) -> list[int]:
        """The committed sequence: the last prompt and its reply."""
        return self.conversation.ids

    @property
    def target_seen(self) -> int:
        return self.conversation.target_seen

    def reset(self) -> None:
        """Forget every cached token (both models). The gamma policy keeps what it learnt."""
        self.conversation.reset()
        self.drafters.reset()

    def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        speculation: SpeculationConfig,
        cancel: threading.Event | None = None,
        constraint: Constraint | None = None,
    ) -> Iterator[Event]:
        """Generate one reply to `prompt_ids`: Token/Rejected/StepDone events and a final ReplyDone; `constraint`
        masks the target's law (constraint.py)."""
        detok = Detokenizer(self.tokenizer)
        for item in self.steps(prompt_ids, sampling, speculation, cancel, constraint):
            if isinstance(item, ReplyEnd):
                yield ReplyDone(item.stats, detok.text, item.ids, item.stop_reason, item.seed)
            elif isinstance(item, PrefillProgress):
                yield item
            else:
                yield from step_events(item, detok)

    def steps(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        speculation: SpeculationConfig,
        cancel: threading.Event | None = None,
        constraint: Constraint | None = None,
    ) -> Iterator[Item]:
        """Generate one reply (reply.py): PrefillProgress while a new prompt is read, committed StepResults (token
        ids, no text) and a final ReplyEnd."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        missing = drafter_needed(self.has_model_drafter, speculation.mode, drafter=speculation.drafter)
        if missing:
            raise ValueError(missing)
        if constraint is not None and speculation.mode == Mode.DRAFTER:
            raise ValueError("a constraint masks the target's law, and drafter mode runs no target")
        if speculation.mode != Mode.TARGET:
            self.drafters.use_view_of(speculation)
            self.drafters.use("model" if speculation.mode == Mode.DRAFTER else speculation.drafter)
        try:
            yield from run_reply(self, list(prompt_ids), sampling, speculation, cancel or threading.Event(), constraint)
        except BaseException:
            self.reset()  # an interrupted forward may leave caches half-updated
            raise


def run_to_end(steps: Iterable[object]) -> ReplyEnd | None:
    """Run a reply's steps (Engine.steps) to their end; its ReplyEnd (None where a stand-in engine gave none)."""
    final = None
    for item in steps:
        final = item if isinstance(item, ReplyEnd) else final
    return final
