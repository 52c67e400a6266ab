"""The request fields that change the target's law, through the server: `logit_bias`, `frequency_penalty` (greedy
speculative equal to target-only under them, and not the reply without them) and `logprobs` (each token's log p
under the target's law, whole and streamed); `top_logprobs` is refused by name."""

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


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"top_logprobs": 3}, "'top_logprobs' is not supported"),
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
