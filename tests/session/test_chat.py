"""ChatSession: chat template, history, KV reuse across turns, context trimming, cancel, compare hook."""

from __future__ import annotations

import copy
import dataclasses
import json
import threading

import pytest
from conftest import make_engine

from specchat.config import Config, SamplingConfig
from specchat.session.chat import ChatError, ChatSession, Notice, TemplateFailure, render_prompt
from specchat.settings import with_value
from specchat.speculative.events import ReplyDone, Token
from specchat.tui.transcript import save_transcript

CONFIG = Config(sampling=SamplingConfig(max_new_tokens=8))


@pytest.fixture
def session(target, unrelated_drafter_model, tokenizer):
    return ChatSession(make_engine(target, unrelated_drafter_model, tokenizer), tokenizer, CONFIG, 1024)


def reply(session, text, cancel=None):
    events = list(session.reply(text, cancel))
    done = [e for e in events if isinstance(e, ReplyDone)]
    assert len(done) == 1
    return events, done[0]


def test_prompt_is_the_chat_template_with_system_prompt(session, tokenizer):
    reply(session, "hello")
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "hello"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert session.last_prompt_ids == tokenizer.encode(expected, add_special_tokens=False)
    assert tokenizer.decode(session.last_prompt_ids).endswith("<|im_start|>assistant\n")


GEMMA_LIKE = (  # gemma's template: no system role, user/model turns
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_turn(tokenizer):
    import copy

    from specchat.session.chat import render_prompt

    gemma_like = copy.deepcopy(tokenizer)
    gemma_like.chat_template = GEMMA_LIKE
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "again"},
    ]
    ids = render_prompt(gemma_like, "Be brief.", messages)
    assert gemma_like.decode(ids) == (
        "<start_of_turn>user\nBe brief.\n\nhello<end_of_turn>\n<start_of_turn>model\n"
        "hi<end_of_turn>\n<start_of_turn>user\nagain<end_of_turn>\n<start_of_turn>model\n"
    )
    assert messages[0]["content"] == "hello"  # the history itself is untouched
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{{ raise_exception('broken') }}"
    with pytest.raises(TemplateFailure, match="chat template failed: TemplateError: broken"):  # still says so
        render_prompt(broken, "", messages)


@pytest.mark.parametrize(
    "template, words",
    [
        ("{{ raise_exception('no system role, ever') }}", "TemplateError: no system role, ever"),
        ("{% for x in messages %}{{ x.content ", "TemplateSyntaxError"),
        ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError"),
        ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ],
)
def test_a_failing_chat_template_is_one_line_naming_its_error(tokenizer, template, words):
    hostile = copy.deepcopy(tokenizer)
    hostile.chat_template = template
    with pytest.raises(TemplateFailure) as failure:
        render_prompt(hostile, "sys", [{"role": "user", "content": "hi"}])
    message = str(failure.value)
    assert message.startswith("the model's chat template failed: ") and words in message
    assert "\n" not in message and len(message) < 300


def test_history_grows_and_the_next_prompt_extends_the_last(session):
    _, first = reply(session, "hello")
    first_prompt = list(session.last_prompt_ids)
    _, second = reply(session, "and again")
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]
    assert session.messages[1]["content"] == first.text
    assert session.last_prompt_ids[: len(first_prompt)] == first_prompt
    assert second.stats.reused_tokens >= len(first_prompt) - 1  # the engine kept the first turn's KV
    assert session.context_used == len(session.last_prompt_ids) + second.stats.new_tokens


def test_system_prompt_change_applies_to_the_next_reply(session, tokenizer):
    session.config = with_value(session.config, "ui.system_prompt", "You are terse.")
    reply(session, "hi")
    assert tokenizer.decode(session.last_prompt_ids).startswith("<|im_start|>system\nYou are terse.<|im_end|>")


def test_oldest_turns_are_dropped_when_the_context_would_overflow(session):
    reply(session, "first question about foxes")
    reply(session, "second question about dogs")
    full = session.render(session.messages + [{"role": "user", "content": "third"}])
    # room for the last turn plus the new message, but not for all three
    session.model_context_limit = len(full) + CONFIG.sampling.max_new_tokens - 1
    events, _ = reply(session, "third")
    notices = [e for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and notices[0].text.startswith("context full: dropped the oldest turn to fit")
    assert [m["content"] for m in session.messages if m["role"] == "user"] == ["second question about dogs", "third"]
    assert len(session.last_prompt_ids) + CONFIG.sampling.max_new_tokens <= session.context_limit


def test_configured_context_limit_is_capped_by_the_model(session):
    assert session.context_limit == 1024
    session.config = with_value(session.config, "ui.context_limit", 300)
    assert session.context_limit == 300
    session.config = with_value(session.config, "ui.context_limit", 5000)
    assert session.context_limit == 1024


def test_a_message_too_long_for_any_context_is_refused_and_history_kept(session):
    reply(session, "hello")
    before = list(session.messages)
    session.config = with_value(session.config, "ui.context_limit", 60)
    with pytest.raises(ChatError, match=r"^the message needs \d+ prompt tokens but only 52 fit"):
        list(session.reply("word " * 100))
    assert session.messages == before


def test_cancel_keeps_the_partial_reply_marked_as_cut(session):
    cancel = threading.Event()
    events = []
    for event in session.reply("tell me more", cancel):
        events.append(event)
        if isinstance(event, Token):
            cancel.set()
    done = events[-1]
    assert done.stop_reason == "cancelled" and 0 < done.stats.new_tokens < CONFIG.sampling.max_new_tokens
    assert session.records[-1].cut and session.messages[-1]["content"] == done.text
    _, after = reply(session, "go on")  # the chat goes on, with consistent caches
    assert after.stop_reason == "max_tokens"


def test_a_cancel_before_the_first_token_leaves_the_conversation_as_it_was(session):
    """Ctrl-C while a long paste is read: nothing was answered, so the paste is not kept either
    (it would be read again, whole, before every later reply)."""
    reply(session, "hello")
    before, used = list(session.messages), session.context_used
    cancel = threading.Event()
    cancel.set()
    events = list(session.reply("a long paste " * 50, cancel))
    assert any(isinstance(e, ReplyDone) and e.stop_reason == "cancelled" and e.ids == () for e in events)
    assert events[-1].text == "cancelled before the reply began: the message was not added to the conversation"
    assert session.messages == before
    assert session.context_used == used < len(session.engine.ids)  # the toolbar's context does not jump
    _, after = reply(session, "go on")
    assert after.stop_reason == "max_tokens" and session.messages[-2]["content"] == "go on"


def test_mode_without_drafter_is_a_chat_error(target, tokenizer):
    alone = ChatSession(make_engine(target, None, tokenizer), tokenizer, CONFIG, 1024)
    with pytest.raises(ChatError, match="needs a drafter model"):
        list(alone.reply("hi"))
    alone.config = with_value(alone.config, "speculation.mode", "target")
    _, done = reply(alone, "hi")
    assert done.stats.mode == "target" and alone.messages[0]["content"] == "hi"


def test_compare_hook_runs_only_when_compare_is_on(session):
    calls = []

    def compare_fn(chat, prompt_ids, done, cancel):
        calls.append((list(prompt_ids), done.text))
        yield "side by side"

    session.compare_fn = compare_fn
    events, _ = reply(session, "one")
    assert calls == [] and "side by side" not in events
    session.config = with_value(session.config, "speculation.compare", "on")
    events, done = reply(session, "two")
    assert calls == [(session.last_prompt_ids, done.text)]
    assert events[-1] == "side by side"


def test_reset_forgets_history_but_keeps_totals(session):
    reply(session, "hello")
    reply(session, "again")
    session.reset()
    assert session.messages == [] and session.records == [] and session.engine.ids == []
    assert session.totals.replies == 2 and session.totals.new_tokens == 16
    _, done = reply(session, "fresh")
    assert done.stats.reused_tokens == 0


def test_save_markdown_and_json_with_each_replys_stats(session, tmp_path):
    _, done = reply(session, "hello")
    save_transcript(session, str(tmp_path / "t.json"))
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["turns"][0]["stats"] == json.loads(json.dumps(done.stats.to_dict()))
    assert data["config"]["sampling.max_new_tokens"] == 8
    save_transcript(session, str(tmp_path / "t.md"))
    text = (tmp_path / "t.md").read_text()
    assert text.startswith("# specchat transcript") and "`8 tok · " in text
    save_transcript(session, str(tmp_path / "t.txt"))
    plain = (tmp_path / "t.txt").read_text()
    assert plain.startswith("system: You are a helpful assistant.\n\nyou> hello\n") and "#" not in plain.split("\n")[0]
    with pytest.raises(ChatError, match=r"must end in .md \(Markdown\), .txt \(plain text\) or .json"):
        save_transcript(session, str(tmp_path / "t.doc"))
    assert dataclasses.asdict(session.totals)["replies"] == 1


def test_a_system_prompt_changed_mid_conversation_gives_an_exact_reply(session, target, tokenizer):
    """The new system prompt changes the conversation's first tokens: the engine must drop the cached
    turns after the change instead of reusing them, and the greedy reply equals transformers' own."""
    from conftest import hf_greedy

    reply(session, "first question about foxes")
    session.config = with_value(session.config, "ui.system_prompt", "You are terse.")
    _, done = reply(session, "and about dogs?")
    prompt = session.last_prompt_ids
    assert tokenizer.decode(prompt).startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert "first question about foxes" in tokenizer.decode(prompt)  # the conversation went on
    assert done.stats.reused_tokens < len(tokenizer.encode("<|im_start|>system\nYou are terse."))
    assert list(done.ids) == hf_greedy(target, prompt, len(done.ids))


def test_dropping_two_turns_says_how_many(session):
    reply(session, "first question about foxes")
    reply(session, "second question about dogs")
    reply(session, "third question about cats")
    full = session.render(session.messages + [{"role": "user", "content": "fourth"}])
    last_two = session.render(session.messages[-2:] + [{"role": "user", "content": "fourth"}])
    # room for the last turn plus the new message only: two turns must go
    session.model_context_limit = len(last_two) + CONFIG.sampling.max_new_tokens
    assert len(full) > session.model_context_limit
    events, _ = reply(session, "fourth")
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and notices[0].startswith("context full: dropped the oldest 2 turns to fit ")
    assert [m["content"] for m in session.messages if m["role"] == "user"] == ["third question about cats", "fourth"]


def test_with_no_cap_a_reply_runs_to_the_context_window_and_is_marked_cut(
    target, unrelated_drafter_model, tokenizer, tmp_path
):
    """max_new_tokens 0 (the default): the tiny random model never ends its turn, so the reply fills the window,
    stops there as context_full, and the stream's mark, /history's record and the saved .md say it was cut."""
    from specchat.session.chat import CUT_MARKS

    assert Config().sampling.max_new_tokens == 0
    session = ChatSession(make_engine(target, unrelated_drafter_model, tokenizer), tokenizer, Config(), 1024)
    prompt = session.render([{"role": "user", "content": "hello"}])
    session.model_context_limit = 4 * len(prompt)
    _, done = reply(session, "hello")
    assert done.stop_reason == "context_full" and len(done.ids) == session.context_limit - len(prompt)
    assert session.records[-1].cut and session.records[-1].cut_mark == CUT_MARKS["context_full"]
    save_transcript(session, str(tmp_path / "t.md"))
    assert "✂ [cut: context window full]" in (tmp_path / "t.md").read_text()


def test_a_capped_reply_is_cut_at_the_cap(session):
    _, done = reply(session, "hello")
    assert done.stop_reason == "max_tokens" and len(done.ids) == CONFIG.sampling.max_new_tokens
    assert session.records[-1].cut_mark == "✂ [cut: /max reached]"


def test_a_pasted_file_sits_in_a_code_fence_in_the_saved_markdown(session, tmp_path):
    from specchat.tui.transcript import transcript_markdown

    paste = "fix this:\ndef f():\n    return 1\n```inner```"
    reply(session, paste)
    text = transcript_markdown(
        {
            "system": "",
            "turns": [{"user": paste, "reply": "ok", "cut": False, "stop_reason": "eos", "stats_line": "1 tok"}],
        }
    )
    assert "## you\n\n````\nfix this:\ndef f():\n    return 1\n```inner```\n````\n" in text
    save_transcript(session, str(tmp_path / "t.md"))
    assert "````\nfix this:" in (tmp_path / "t.md").read_text()
