"""The /why view: the last reply's rejected drafts, one row each, or the N-th one in full.

p is the target's probability of the drafted token, q the drafter's, under the sampling settings
(plain softmax in greedy mode, where the rule compares argmaxes and the logit margin says by how much
the target preferred its own token); see speculative/insight.py.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from specchat.safe_text import json_text
from specchat.session.chat import ChatSession
from specchat.speculative.insight import Ranked, Rejection
from specchat.tui.render import as_table


def token_text(tokenizer, token_id: int) -> str:
    """A token as a quoted string, escapes visible: "\\n    def", "\\u001b" (no control character is left raw)."""
    return json_text(tokenizer.decode([token_id]))


def ranked_text(tokenizer, ranked: Ranked, separator: str = "  ") -> str:
    return separator.join(f"{token_text(tokenizer, i)} {p:.2f}" for i, p in ranked)


def source_words(rejection: Rejection) -> str:
    """What drafted it, in words: "by the model", "copied by lookup", "by the model as text"; "" when unknown."""
    return {"model": "by the model", "lookup": "copied by lookup", "text": "by the model as text"}.get(
        rejection.source, ""
    )


def rule_text(rejection: Rejection) -> str:
    """Why the rule refused it: the acceptance probability, or the greedy logit margin."""
    if rejection.accept_p is None:
        return f"greedy: margin {rejection.margin:.2f}"
    return f"min(1, p/q) = {rejection.accept_p:.2f}"


def rejections_table(tokenizer, rejections: list[Rejection]) -> Table:
    """Three lines per rejection: what was drafted and emitted with q, p and the rule, then each
    model's top 5 there."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("#", style="cyan", no_wrap=True)
    table.add_column("rejection", overflow="fold")
    for number, r in enumerate(rejections, 1):
        source = f" ({source_words(r)})" if source_words(r) else ""
        lines = (
            f"step {r.step + 1} · draft {r.position + 1}{source}: drafted {token_text(tokenizer, r.drafted)} "
            f"(q {r.q:.2f}, p {r.p:.2f}) · the target emitted {token_text(tokenizer, r.emitted)} · "
            f"{rule_text(r)}\n"
            f"  target : {ranked_text(tokenizer, r.target_top)}\n"
            f"  drafter: {ranked_text(tokenizer, r.drafter_top)}"
        )
        table.add_row(str(number), Text(lines))
    return table


def rejection_detail(tokenizer, number: int, r: Rejection) -> Table:
    rows = [
        ("where", f"step {r.step + 1}, draft position {r.position + 1}"),
        ("drafted", ", ".join(filter(None, [f"{token_text(tokenizer, r.drafted)} (id {r.drafted})", source_words(r)]))),
        ("emitted", f"{token_text(tokenizer, r.emitted)} (id {r.emitted}), the target's token instead"),
        ("q", f"{r.q:.4f}  the drafter's probability of the drafted token"),
        ("p", f"{r.p:.4f}  the target's probability of it"),
        ("rule", rule_text(r)),
        (f"target top {len(r.target_top)}", ranked_text(tokenizer, r.target_top, "\n")),
        (f"drafter top {len(r.drafter_top)}", ranked_text(tokenizer, r.drafter_top, "\n")),
    ]
    return as_table(rows, (f"rejection {number}", ""))


def why(session: ChatSession, arg: str) -> Table | str:
    """The renderable for `/why [N]`; raises ValueError with a one-line message for a bad N."""
    if not session.records:
        return "no reply yet: /why explains the rejected drafts of the last reply"
    rejections = session.records[-1].rejections
    if not rejections:
        drafted = session.records[-1].stats.drafted
        return "the last reply had no rejected drafts" + (
            f" ({drafted} drafted, every one accepted)" if drafted else " (it drafted nothing)"
        )
    if not arg:
        return rejections_table(session.tokenizer, rejections)
    if not arg.isdigit() or not 1 <= int(arg) <= len(rejections):
        raise ValueError(f"/why: N must be a rejection number from 1 to {len(rejections)}")
    return rejection_detail(session.tokenizer, int(arg), rejections[int(arg) - 1])
