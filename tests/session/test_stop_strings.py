"""Stop strings: a base model chatting in specchat's plain User:/Assistant: template
stops where it starts writing the user's next turn ("\\nUser:"), and nothing of that turn is shown."""

from __future__ import annotations

import pytest
from conftest import ScriptedEngine, hf_greedy, make_engine, scripted_reply
from tinypair import tiny_pair

from specchat.config import Config, SamplingConfig, SpeculationConfig
from specchat.launch import start_session
from specchat.session.chat import ChatSession
from specchat.session.compare import Comparer, CompareReport
from specchat.session.stop_strings import STOP_STRING, StopFilter, held_length
from specchat.speculative.events import Origin, ReplyDone, Token
from specchat.speculative.metrics import ReplyStats

B, D = Origin.BONUS, Origin.DRAFTED
FAKE_TURN = [
    ("Sure", B),
    (",", D),
    (" here", B),
    ("\n", B),
    ("Us", D),
    ("ually", B),
    (" fine.", B),
    ("\n", D),
    ("User", D),
    (": and", B),
    (" more", B),
]  # the model writes the user's next turn
SHOWN = "Sure, here\nUsually fine."


class LoggingEngine(ScriptedEngine):
    """A ScriptedEngine that logs each Token it sends, so a test can tell what was held back."""

    def __init__(self, replies, log: list):
        super().__init__(replies)
        self.log = log

    def stream(self, prompt_ids, sampling, speculation, cancel=None, constraint=None):
        for event in super().stream(prompt_ids, sampling, speculation, cancel):
            if isinstance(event, Token):
                self.log.append(("sent", event.text))
            yield event


def chat_on(template: str, replies, tokenizer, target, drafter, log: list) -> ChatSession:
    """The CLI's session for a pair whose target uses `template`, answering with scripted replies."""
    pair = tiny_pair(tokenizer, target, drafter)
    pair.target_facts.template = template
    session = start_session(Config(sampling=SamplingConfig(max_new_tokens=64)), pair, None)  # capped: max_tokens
    session.engine = LoggingEngine(replies, log)
    return session


def shown_reply(session: ChatSession, text: str, log: list) -> ReplyDone:
    done = None
    for event in session.reply(text):
        if isinstance(event, Token):
            log.append(("shown", event.text))
        done = event if isinstance(event, ReplyDone) else done
    return done


@pytest.mark.parametrize("template", ["plain", "own"])
def test_only_the_plain_template_cuts_a_reply_at_the_next_user_turn(
    template, tokenizer, target, unrelated_drafter_model
):
    log: list = []
    session = chat_on(
        template,
        [scripted_reply(FAKE_TURN, ReplyStats(), "max_tokens")],
        tokenizer,
        target,
        unrelated_drafter_model,
        log,
    )
    done = shown_reply(session, "hi", log)
    shown = "".join(text for kind, text in log if kind == "shown")
    whole = "".join(text for text, _origin in FAKE_TURN)
    if template == "own":  # a model with its own template ends its turns with a stop token: not cut
        assert shown == done.text == session.messages[-1]["content"] == whole
        assert done.stop_reason == "max_tokens"
        return
    assert shown == done.text == session.messages[-1]["content"] == session.records[-1].text == SHOWN
    assert done.stop_reason == session.records[-1].stop_reason == STOP_STRING
    assert "".join(t.text for t in session.records[-1].tokens) == SHOWN
    assert done.ids == tuple(t.id for t in session.records[-1].tokens) == tuple(range(100, 107))


def test_text_that_may_begin_the_stop_string_is_held_back_until_it_is_not(tokenizer, target, unrelated_drafter_model):
    log: list = []
    session = chat_on(
        "plain",
        [scripted_reply(FAKE_TURN, ReplyStats(), "max_tokens")],
        tokenizer,
        target,
        unrelated_drafter_model,
        log,
    )
    shown_reply(session, "hi", log)
    assert log.index(("shown", "\n")) > log.index(("sent", "ually"))  # "\n", "\nUs" were held back
    assert log.index(("shown", "Us")) > log.index(("sent", "ually"))
    assert log.index(("shown", " here")) < log.index(("sent", "\n"))  # the text before them was not
    assert log.index(("shown", " fine.")) < log.index(("sent", "User"))
    assert ("shown", "User") not in log and log.count(("shown", "\n")) == 1


def test_a_reply_ending_in_a_held_back_tail_shows_it_at_the_end(tokenizer, target, unrelated_drafter_model):
    log: list = []
    pieces = [("Done", B), ("\n", D), ("Us", B)]  # max_tokens hit in what might have become "\nUser:"
    session = chat_on(
        "plain", [scripted_reply(pieces, ReplyStats(), "max_tokens")], tokenizer, target, unrelated_drafter_model, log
    )
    done = shown_reply(session, "hi", log)
    assert [text for kind, text in log if kind == "shown"] == ["Done", "\n", "Us"]
    assert done.text == session.messages[-1]["content"] == "Done\nUs" and done.stop_reason == "max_tokens"


def test_a_stop_string_beginning_inside_a_token_keeps_the_tokens_part_before_it():
    stops = StopFilter(("\nUser:",))
    tokens = [Token(1, "ok", B), Token(2, ".\nUs", B), Token(3, "er: hi", B)]
    out = [e for token in tokens for e in stops.feed(token)]
    assert [t.text for t in out] == ["ok", "."] and stops.cut
    assert held_length("a\nUse", ("\nUser:",)) == 4 and held_length("a\nUsa", ("\nUser:",)) == 0


GREEDY_SPEC = Config(
    sampling=SamplingConfig(temperature=0.0, max_new_tokens=24), speculation=SpeculationConfig(gamma=4)
)


def free_reply(target, drafter, tokenizer, cfg=GREEDY_SPEC):
    """A greedy reply with no stop string: its text and each token's (start, text) in it."""
    session = ChatSession(make_engine(target, drafter, tokenizer), tokenizer, cfg, 1024)
    events = list(session.reply("Hello, how are you"))
    starts, text = [], ""
    for event in events:
        if isinstance(event, Token):
            starts.append(len(text))
            text += event.text
    return text, set(starts)


def stop_inside_a_token(text: str, starts: set[int]) -> tuple[str, int]:
    """A 3-character stop string first found in `text` early on, beginning inside a token."""
    for at in range(len(text) // 4, len(text) - 3):
        if at not in starts and text.find(text[at : at + 3]) == at:
            return text[at : at + 3], at
    raise AssertionError(f"no usable stop string in {text!r}")


def test_a_cut_reply_leaves_the_engine_exact_for_the_next_turn(target, similar_drafter_model, tokenizer):
    """The engine is halted after the step that wrote the stop string, whose later tokens it had
    already committed; the next prompt holds only the cut text, and the next reply is still exactly
    transformers' greedy continuation of it."""
    text, starts = free_reply(target, similar_drafter_model, tokenizer)
    stop, at = stop_inside_a_token(text, starts)
    session = ChatSession(
        make_engine(target, similar_drafter_model, tokenizer), tokenizer, GREEDY_SPEC, 1024, stop_strings=(stop,)
    )
    done = [e for e in session.reply("Hello, how are you") if isinstance(e, ReplyDone)][0]
    assert done.text == session.messages[-1]["content"] == text[:at] and done.stop_reason == STOP_STRING
    assert done.stats.new_tokens < GREEDY_SPEC.sampling.max_new_tokens  # halted, not run to the end
    assert len(session.engine.ids) > len(session.last_prompt_ids) + len(done.ids)  # it wrote past the cut
    second = [e for e in session.reply("and then?") if isinstance(e, ReplyDone)][0]
    prompt = session.last_prompt_ids
    assert text[:at] in tokenizer.decode(prompt) and text[: at + 3] not in tokenizer.decode(prompt)
    assert list(second.ids) == hf_greedy(target, prompt, len(second.ids))
    assert session.engine.ids == prompt + list(second.ids)


def test_compare_of_a_cut_reply_compares_as_far_as_the_reply_went(target, similar_drafter_model, tokenizer):
    from dataclasses import replace

    text, starts = free_reply(target, similar_drafter_model, tokenizer)
    stop, at = stop_inside_a_token(text, starts)
    cfg = replace(GREEDY_SPEC, speculation=replace(GREEDY_SPEC.speculation, compare="on"))
    comparer = Comparer(tiny_pair(tokenizer, target, similar_drafter_model))
    session = ChatSession(
        make_engine(target, similar_drafter_model, tokenizer),
        tokenizer,
        cfg,
        1024,
        compare_fn=comparer,
        stop_strings=(stop,),
    )
    [report] = [e for e in session.reply("Hello, how are you") if isinstance(e, CompareReport)]
    assert report.identical and report.divergence is None
    assert report.spec.text == text[:at] and report.target.ids == report.spec.ids


def test_stats_say_why_a_cut_reply_stopped():
    import io

    from rich.console import Console

    from specchat.tui.stats_view import reply_summary

    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(reply_summary(ReplyStats(), STOP_STRING))
    assert "the model began the next User: turn (cut there)" in console.file.getvalue()


def test_a_users_stop_text_ends_the_reply_before_it(tokenizer):
    """sampling.stop (/stop TEXT): the reply is cut where the text begins, as at the plain template's turn."""
    pieces = [("Step one. ", Origin.TARGET), ("Step two. ", Origin.TARGET), ("DONE and more", Origin.TARGET)]
    engine = ScriptedEngine([scripted_reply(pieces, ReplyStats(new_tokens=3)), scripted_reply(pieces, ReplyStats())])
    cfg = Config(sampling=SamplingConfig(stop=("DONE",)))
    session = ChatSession(engine, tokenizer, cfg, 1024)
    done = [e for e in session.reply("Count the steps.") if isinstance(e, ReplyDone)][-1]
    assert done.text == "Step one. Step two. " and done.stop_reason == STOP_STRING
    session.config = Config()
    done = [e for e in session.reply("Again.") if isinstance(e, ReplyDone)][-1]
    assert done.text == "Step one. Step two. DONE and more"  # no stop text: the whole reply
