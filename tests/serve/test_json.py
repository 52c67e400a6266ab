"""JSON mode through specchat serve and the official openai client: `response_format` json_schema and json_object
hold the reply to JSON, speculative equal to target-only under the same schema; a schema that cannot be used, or a
format the server does not know, is a 400 that says why."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient
from test_server import LOCAL, started
from tinypair import tiny_pair

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
ASK = [{"role": "user", "content": "The weather in Paris, as JSON."}]


@pytest.fixture(scope="module")
def client(tokenizer, target, similar_drafter_model):
    app, _ = started(tiny_pair(tokenizer, target, similar_drafter_model))
    return TestClient(app, base_url=LOCAL)


def openai_on(client):
    from openai import OpenAI

    return OpenAI(base_url=f"{LOCAL}/v1", api_key="unused", http_client=client, max_retries=0)


def test_a_json_schema_reply_parses_and_speculation_equals_target_only(client):
    api = openai_on(client)
    spec = api.chat.completions.create(model="m", messages=ASK, response_format=FORMAT, max_tokens=300)
    alone = api.chat.completions.create(
        model="m", messages=ASK, response_format=FORMAT, max_tokens=300, extra_body={"gamma": 0}
    )
    assert spec.choices[0].finish_reason == "stop", spec.choices[0].message.content
    value = json.loads(spec.choices[0].message.content)
    assert set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool) and len(value["city"]) <= 10
    assert spec.model_extra["specchat"]["token_ids"] == alone.model_extra["specchat"]["token_ids"]
    assert spec.usage.model_extra["specchat"]["drafted"] > 0 == alone.usage.model_extra["specchat"]["drafted"]


def test_json_object_mode_streams_a_json_object(client):
    api = openai_on(client)
    chunks = list(
        api.chat.completions.create(
            model="m", messages=ASK, response_format={"type": "json_object"}, max_tokens=600, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text.lstrip().startswith("{")
    if finish == ["stop"]:  # ended by the model: a whole object (else cut at max_tokens: "length")
        assert isinstance(json.loads(text), dict)
    else:
        assert finish == ["length"]


@pytest.mark.parametrize(
    "response_format, words",
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}, "cannot be used"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema' must be"),
        ({"type": "grammar"}, "must be text, json_object or json_schema"),
    ],
)
def test_a_format_that_cannot_be_held_is_a_400(client, response_format, words):
    body = {"messages": ASK, "response_format": response_format}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
