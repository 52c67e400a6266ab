"""The request fields that change the target's law, through the server: `logit_bias`, `frequency_penalty` (greedy
speculative equal to target-only under them, and not the reply without them) and `logprobs` and `top_logprobs` (each
token's log p under the target's law, and the law's likeliest tokens at its place, whole and streamed)."""

from __future__ import annotations

import json
import math

import pytest
from starlette.testclient import TestClient
from test_server import ASK, LOCAL, started
from tinypair import tiny_pair

CHAT = "/v1/chat/completions"
LONG = {**ASK, "max_tokens": 24}


@pytest.fixture(scope="module")
def client(tokenizer, target, similar_drafter_model):
    app, _ = started(tiny_pair(tokenizer, target, similar_drafter_model))
    return TestClient(app, base_url=LOCAL)


def ids_of(client, **fields) -> list[int]:
    reply = client.post(CHAT, json={**LONG, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()["specchat"]["token_ids"]


@pytest.mark.parametrize("fields", [{"frequency_penalty": 2.0}, {"logit_bias": {"40": 8, "41": -100}}])
def test_a_rule_on_the_law_keeps_greedy_speculation_exact_and_changes_the_reply(client, fields):
    plain = ids_of(client)
    spec, alone = ids_of(client, **fields), ids_of(client, gamma=0, **fields)
    assert spec == alone != plain
    if "logit_bias" in fields:
        assert 41 not in spec and spec.count(40) > plain.count(40)


def test_null_law_fields_ask_for_nothing(client):
    nulls = {"frequency_penalty": None, "logit_bias": None, "logprobs": None, "top_logprobs": None}
    assert ids_of(client, **nulls) == ids_of(client)


def test_logprobs_give_each_token_s_log_p_whole_and_streamed(client):
    body = client.post(CHAT, json={**LONG, "logprobs": True}).json()
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == body["usage"]["completion_tokens"] == len(body["specchat"]["token_ids"])
    assert all(e["logprob"] <= 0 and e["top_logprobs"] == [] for e in entries)
    assert "".join(e["token"] for e in entries) == body["choices"][0]["message"]["content"]
    assert all(math.exp(e["logprob"]) > 0 for e in entries)
    with client.stream("POST", CHAT, json={**LONG, "logprobs": True, "stream": True}) as reply:
        chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    streamed = [e for c in chunks if c["choices"][0].get("logprobs") for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in entries])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_top_logprobs_list_the_law_s_likeliest_tokens_at_each_place(client, temperature):
    fields = {"logprobs": True, "top_logprobs": 3, "temperature": temperature, "seed": 7, "top_k": 5}
    body = client.post(CHAT, json={**LONG, **fields}).json()
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == len(body["specchat"]["token_ids"])
    for entry in entries:
        top = [alternative["logprob"] for alternative in entry["top_logprobs"]]
        assert len(top) == 3 and top == sorted(top, reverse=True) and all(lp <= 1e-6 for lp in top)
        assert entry["logprob"] <= top[0] + 1e-4  # no token is likelier than the law's likeliest
        if temperature == 0.0:  # greedy: the token is the likeliest, its log p the first alternative's
            assert entry["logprob"] == pytest.approx(top[0], abs=1e-4)
    with client.stream("POST", CHAT, json={**LONG, **fields, "stream": True}) as reply:
        chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    streamed = [e for c in chunks if c["choices"][0].get("logprobs") for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["top_logprobs"] for e in streamed] == [e["top_logprobs"] for e in entries]


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"top_logprobs": 3}, "'top_logprobs' needs 'logprobs': true"),
        ({"top_logprobs": 21, "logprobs": True}, "'top_logprobs' must be an integer from 0 to 20"),
        ({"logprobs": "yes"}, "'logprobs' must be true or false"),
        ({"frequency_penalty": 3}, "'frequency_penalty' must be a number from -2 to 2"),
        ({"logit_bias": {"x": 1}}, "keys must be token ids"),
        ({"logit_bias": {"5": 101}}, "must be a number from -100 to 100"),
        ({"logit_bias": {"999999": 1}}, "the vocabulary has"),
    ],
)
def test_bad_law_fields_are_a_400_that_names_them(client, fields, words):
    reply = client.post(CHAT, json={**ASK, **fields})
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
