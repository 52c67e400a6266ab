"""Warming a new session up before the user's first message: first-call set-up is not billed to it, the chat
template is probed under a time and a memory limit (template_probe.py) and the system prompt checked against the
context first, and the pair's expected speed is timed (pair_cost.py). The session
owns it: the UI only shows what it returns."""

from __future__ import annotations

import dataclasses
import threading

from specchat.config import Mode, SamplingConfig
from specchat.session.chat import ChatError, ChatSession
from specchat.session.pair_cost import FALLBACK_GAMMA, PairCost, measured_cost
from specchat.session.template_probe import probe_template
from specchat.speculative.engine import run_to_end
from specchat.speculative.events import ReplyEnd
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.step import StepResult

WARM_TOKENS = 2  # the prompt's forward and one step's: each kind of forward's first-call set-up (a 7B: 2 more, 0.3 s)
TIMED_STEPS = 3  # a target step and γ drafter forwards each: where every draft is rejected, 3 of 8 tokens' steps


def warm_up(session: ChatSession) -> PairCost | None:
    """One short throw-away reply, so first-call kernel set-up is not billed to the user's first reply; then,
    with a drafter, a second one timed for the pair's expected speed (session/pair_cost.py). The replies are
    forgotten, their prompt's cache is not: it begins with the system prompt, as the user's first prompt does, so
    that reply reads only its own message (a 7B target's first reply to "hi": 5 tokens read, not 19)."""
    cfg = session.config
    mode = Mode.SPEC if session.has_drafter else Mode.TARGET
    sampling = dataclasses.replace(cfg.sampling, max_new_tokens=WARM_TOKENS)
    probe_template(session.tokenizer, session.system_prompt)  # a template that loops or grows: one line, now
    ids = session.render([{"role": "user", "content": "Say hello."}])
    check_system_prompt_fits(session, len(ids))
    run_to_end(session.engine.steps(ids, sampling, dataclasses.replace(cfg.speculation, mode=mode)))
    cost = _timed_cost(session, ids, sampling) if mode == Mode.SPEC and cfg.speculation.drafter != "lookup" else None
    session.engine.use_policy(AutoGamma())  # warm-up timings include first-call set-up: learn c afresh
    return cost


def check_system_prompt_fits(session: ChatSession, tokens: int) -> None:
    """Refuse, before any forward, a system prompt that leaves no room for a message and its reply."""
    room = session.context_limit - session.reply_room
    if tokens > room:
        raise ChatError(
            f"the system prompt with a short message is {tokens:,} tokens, and {max(room, 0):,} fit (context "
            f"{session.context_limit:,} minus {session.reply_room:,} kept for the reply); shorten it (--system, "
            f"ui.system_prompt) or raise ui.context_limit"
        )


def _timed_cost(session: ChatSession, ids: list[int], sampling: SamplingConfig) -> PairCost | None:
    """The pair's cost from a short reply's first TIMED_STEPS steps (its prompt's cache kept from the first reply:
    read again it cost 0.5 s of a 7B target's warm start, and only steps are timed)."""
    gamma = session.config.speculation.gamma
    gamma = gamma if isinstance(gamma, int) and gamma > 0 else FALLBACK_GAMMA
    speculation = dataclasses.replace(session.config.speculation, mode=Mode.SPEC, gamma=gamma)
    cancel, steps, end = threading.Event(), 0, None
    for item in session.engine.steps(ids, dataclasses.replace(sampling, max_new_tokens=8), speculation, cancel):
        steps += isinstance(item, StepResult)
        if steps >= TIMED_STEPS:
            cancel.set()  # the reply ends before its next step
        end = item if isinstance(item, ReplyEnd) else end
    return measured_cost(end.stats, gamma) if end is not None else None
