"""Tools through specchat serve as the official openai client uses them: `tools` rendered by the model's own chat
template, the model's `<tool_call>` markup read back as `tool_calls` (whole and streamed), and the round trip of a
call, its result and the final answer. The replies are scripted (the tiny models write no tool calls); the prompts
are the real template's."""

from __future__ import annotations

import copy
import json
import time

import pytest
from conftest import ScriptedEngine, scripted_reply
from starlette.testclient import TestClient
from test_server import LOCAL

from specchat.config import Config
from specchat.serve.app import Settings, build_app
from specchat.serve.service import Service
from specchat.serve.tool_calls import parse_reply, shown_before_calls
from specchat.speculative.metrics import ReplyStats
from specchat.speculative.origin import Origin

# The bundled Qwen2.5 template's tools section and tool turns, cut to what the tiny tokenizer needs
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
T = Origin.TARGET
CALL = [("<tool", T), ("_call>\n", T), ('{"name": "get_weather", ', T), ('"arguments": {"city": "Paris"}}', T)]
CALL += [("\n</tool_call>", T)]
ANSWER = [("It is ", T), ("sunny in Paris.", T)]


@pytest.fixture()
def tools_tokenizer(tokenizer):
    tools = copy.deepcopy(tokenizer)
    tools.chat_template = TOOLS_TEMPLATE
    return tools


def served(tokenizer, replies):
    engine = ScriptedEngine([scripted_reply(pieces, ReplyStats(new_tokens=len(pieces))) for pieces in replies])
    service = Service(engine, tokenizer, "", 4096)
    client = TestClient(build_app(service, Settings("m", Config(), log=lambda line: None)), base_url=LOCAL)
    return client, engine


def openai_on(client):
    from openai import OpenAI

    return OpenAI(base_url=f"{LOCAL}/v1", api_key="unused", http_client=client, max_retries=0)


def test_a_tool_call_its_result_and_the_final_answer_through_the_openai_client(tools_tokenizer):
    client, engine = served(tools_tokenizer, [CALL, ANSWER])
    api = openai_on(client)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = api.chat.completions.create(model="m", messages=ask, tools=[WEATHER])
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_") and first.choices[0].message.content is None
    prompt = tools_tokenizer.decode(engine.prompts[0])
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt  # the template's tools section
    history = ask + [first.choices[0].message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'})
    final = api.chat.completions.create(model="m", messages=history, tools=[WEATHER])
    assert final.choices[0].message.content == "It is sunny in Paris." and final.choices[0].finish_reason == "stop"
    prompt = tools_tokenizer.decode(engine.prompts[1])
    assert '"arguments": {"city": "Paris"}}' in prompt  # an object, not a JSON string encoded twice
    assert '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in prompt


def test_a_streamed_tool_call_arrives_as_delta_tool_calls(tools_tokenizer):
    client, _ = served(tools_tokenizer, [[("Let me check. ", T), *CALL]])
    api = openai_on(client)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    chunks = list(api.chat.completions.create(model="m", messages=ask, tools=[WEATHER], stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices and c.choices[0].delta.tool_calls for t in c.choices[0].delta.tool_calls]
    assert content == "Let me check. " and "<tool" not in content
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        (0, "get_weather", {"city": "Paris"})
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_reply_without_a_call_is_plain_text_and_held_text_is_sent(tools_tokenizer):
    client, _ = served(tools_tokenizer, [[("a <tool", T), ("box>", T)]])
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER], "stream": True},
    ) as reply:
        lines = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in lines) == "a <toolbox>"
    assert lines[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "body, words",
    [
        ({"tools": [WEATHER], "tool_choice": "required"}, "'tool_choice' may be 'auto' or 'none'"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0] must be"),
        ({"tools": "get_weather"}, "'tools' must be a list"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "no 'tools'"),
    ],
)
def test_tools_the_server_cannot_honour_are_a_400_that_says_why(tools_tokenizer, body, words):
    client, _ = served(tools_tokenizer, [])
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **body})
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]


def test_a_template_without_a_tools_section_refuses_tools(tokenizer):
    client, _ = served(tokenizer, [])
    reply = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]}
    )
    assert reply.status_code == 400 and "no tools section" in reply.json()["error"]["message"]


def test_a_bare_call_in_a_json_fence_naming_an_offered_tool_is_a_call(tools_tokenizer):
    fenced = [("```json\n", T), ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', T), ("\n```", T)]
    client, _ = served(tools_tokenizer, [fenced, fenced])
    api = openai_on(client)
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    whole = api.chat.completions.create(model="m", messages=ask, tools=[WEATHER])
    assert whole.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = list(api.chat.completions.create(model="m", messages=ask, tools=[WEATHER], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""  # held, then a call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    names = frozenset({"get_weather"})
    assert parse_reply('{"name": "other", "arguments": {}}', names).calls == []  # not an offered tool: text
    assert parse_reply('Here: {"name": "get_weather", "arguments": {}}', names).calls == []  # not alone: text


def test_markup_that_is_not_a_call_stays_text():
    assert parse_reply("<tool_call>\nnot json\n</tool_call>").calls == []
    assert parse_reply('<tool_call>{"arguments": {}}</tool_call>').content == '<tool_call>{"arguments": {}}</tool_call>'
    two = parse_reply('a<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}</tool_call>')
    assert [c["function"]["name"] for c in two.calls] == ["f", "g"] and two.content == "a"
    assert shown_before_calls("hi <tool_") == "hi " and shown_before_calls("x<tool_call>{") == "x"
    deep = "[" * 100_000  # a model's text nested past the recursion limit: text, not a crash
    assert parse_reply(deep, frozenset({"f"})).calls == [] and parse_reply(f"<tool_call>{deep}</tool_call>").calls == []
    for spaces in ("```" + " " * 20_000 + "x", "<tool_call>" + " " * 20_000, "<tool_call>" * 5_000):
        began = time.perf_counter()
        assert parse_reply(spaces, frozenset({"f"})).calls == [] and shown_before_calls(spaces) == ""
        assert time.perf_counter() - began < 5.0  # a hang bound, not a speed claim: a regex took 16 s on 4,000 spaces
