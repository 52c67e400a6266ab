"""specchat serve: OpenAI-shaped replies equal to the one-shot chat's, every token's origin, bounded requests,
one-line JSON errors, the API key, the queue's 429, and a client that goes away cancelling its reply."""

from __future__ import annotations

import io
import json
import socket

import pytest
from starlette.testclient import TestClient
from tinypair import loader, tiny_pair

from specchat.serve import cli as serve_cli
from specchat.serve.app import Settings, build_app
from specchat.serve.service import Service
from specchat.tui.cli import main as chat_main

SETTINGS = ["speculation.gamma=4", "speculation.drafter=model", "ui.system_prompt=Be brief."]
LOCAL = "http://127.0.0.1"  # a Host the server answers (guard.py)
ASK = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12}


@pytest.fixture(scope="module")
def pair(tokenizer, target, similar_drafter_model):
    return tiny_pair(tokenizer, target, similar_drafter_model)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def started(pair, *argv: str):
    """The app `specchat serve` would run, and what it said on stderr."""
    apps, err = [], io.StringIO()
    args = serve_cli.build_parser().parse_args(["--port", str(free_port()), *argv, *SETTINGS])
    assert serve_cli.serve(args, loader(pair), err, run=lambda app, host, port: apps.append(app)) == 0
    return apps[0], err.getvalue()


@pytest.fixture(scope="module")
def client(pair):
    app, said = started(pair)
    assert "tiny-target on http://127.0.0.1:" in said
    return TestClient(app, base_url=LOCAL)


def one_shot(pair, text: str, max_new: int) -> dict:
    out, err = io.StringIO(), io.StringIO()
    argv = ["--prompt", text, "--json", f"sampling.max_new_tokens={max_new}", *SETTINGS]
    assert chat_main(argv, load=loader(pair), compare=None, stdin=io.StringIO(), stdout=out, stderr=err) == 0, err
    return json.loads(out.getvalue())


def test_a_greedy_chat_reply_equals_the_one_shot_json_reply_token_for_token(pair, client):
    reply = client.post("/v1/chat/completions", json=ASK)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    expected = one_shot(pair, "hello there", 12)
    assert body["specchat"]["token_ids"] == [t["id"] for t in expected["tokens"]]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected["text"]}
    assert body["specchat"]["origins"] == [t["origin"] for t in expected["tokens"]]
    assert body["object"] == "chat.completion" and body["model"] == "tiny-target"
    usage = body["usage"]
    assert usage["completion_tokens"] == len(expected["tokens"]) and usage["prompt_tokens"] > 0
    assert usage["specchat"]["drafted"] >= usage["specchat"]["accepted"] >= 0
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_streamed_reply_is_the_same_reply_in_chunks_with_each_token_s_origin(client):
    whole = client.post("/v1/chat/completions", json=ASK).json()
    with client.stream("POST", "/v1/chat/completions", json={**ASK, "stream": True}) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    ids = [i for c in chunks if "specchat" in c for i in c["specchat"]["token_ids"]]
    origins = [o for c in chunks if "specchat" in c for o in c["specchat"]["origins"]]
    assert text == whole["choices"][0]["message"]["content"] and ids == whole["specchat"]["token_ids"]
    assert origins == whole["specchat"]["origins"] and set(origins) <= {"drafted", "corrected", "bonus", "target"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["usage"]["completion_tokens"] == len(ids)


def test_a_client_resending_the_history_has_only_its_new_messages_read(client):
    first = client.post("/v1/chat/completions", json=ASK).json()
    said = first["choices"][0]["message"]["content"]
    history = ASK["messages"] + [{"role": "assistant", "content": said}, {"role": "user", "content": "and then?"}]
    second = client.post("/v1/chat/completions", json={"messages": history, "max_tokens": 4}).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] <= cached < second["usage"]["prompt_tokens"]


def test_plain_completions_and_the_model_list(client):
    body = client.post("/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 5}).json()
    assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str)
    assert body["usage"]["completion_tokens"] == 5
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-target"
    assert client.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({}, 400, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role must be one of"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "content must be a string"),
        ({**ASK, "temperature": -1}, 400, "temperature"),
        ({**ASK, "temperature": "hot"}, 400, "temperature"),
        ({**ASK, "gamma": 99}, 400, "gamma must be"),
        ({**ASK, "drafter": "oracle"}, 400, "drafter"),
        ({**ASK, "max_tokens": 0}, 400, "max_tokens"),
        ({**ASK, "max_tokens": 10**9}, 400, "does not fit"),
        ({**ASK, "stop": ["a"] * 9}, 400, "stop"),
        ({**ASK, "stream": "yes"}, 400, "stream"),
        ({**ASK, "n": 3}, 400, "'n' must be 1"),
        ([1, 2], 400, "JSON object"),
        ({**ASK, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "has no tools section"),
        ({**ASK, "functions": [{"name": "f"}]}, 400, "'functions' is not supported"),
        ({**ASK, "best_of": 3}, 400, "'best_of' is not supported"),
        ({**ASK, "response_format": {"type": "xml"}}, 400, "response_format.type' must be"),
    ],
)
def test_a_bad_request_gets_one_json_error_and_the_server_goes_on(client, body, status, words):
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert words in error["message"] and "Traceback" not in reply.text and error["type"]
    assert client.post("/v1/chat/completions", json={**ASK, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(
    "route, body, field",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800b"}]}, "'messages[0].content'"),
        ("/v1/completions", {"prompt": "x\udfff"}, "'prompt'"),
        ("/v1/chat/completions", {**ASK, "stop": ["\ud83d"]}, "'stop'"),
    ],
)
def test_a_lone_surrogate_is_a_400_that_names_its_field(client, route, body, field):
    reply = client.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"].startswith(f"{field} holds a lone surrogate")


def test_a_body_past_the_bound_or_not_json_is_refused(pair):
    service = Service(None, pair.tokenizer, "", 1024)
    from specchat.settings import load_config

    client = TestClient(build_app(service, Settings("m", load_config(None), max_body=100)), base_url=LOCAL)
    as_json = {"Content-Type": "application/json"}
    assert client.post("/v1/chat/completions", content=b"{" + b" " * 200 + b"}", headers=as_json).status_code == 413
    reply = client.post("/v1/chat/completions", content=b"{not json", headers=as_json)
    assert reply.status_code == 400 and "not JSON" in reply.json()["error"]["message"]


def test_the_api_key_is_asked_of_every_route_but_health(pair):
    app, said = started(pair, "--api-key", "sesame")
    client = TestClient(app, base_url=LOCAL)
    assert "API key required" in said
    assert client.post("/v1/chat/completions", json=ASK).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer sesame"}).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": "bearer  sesame "}).status_code == 200  # any case
    assert client.get("/v1/models", headers={"Authorization": "Basic sesame"}).status_code == 401
    assert client.get("/health").status_code == 200


def test_a_full_queue_answers_429_with_retry_after(pair):
    app, _ = started(pair, "--queue", "1")
    client = TestClient(app, base_url=LOCAL)
    service = app.state.service
    release = service.admit()  # the one place, taken
    try:
        reply = client.post("/v1/chat/completions", json=ASK)
        assert reply.status_code == 429 and reply.headers["retry-after"] == "2"
    finally:
        release()
    assert client.post("/v1/chat/completions", json=ASK).status_code == 200
    assert service.admitted_now == 0


@pytest.mark.parametrize(
    "argv, words", [(["--port", "0"], "--port"), (["--queue", "0"], "--queue"), (["speculation.gamma=x"], "gamma")]
)
def test_bad_server_options_are_one_line(pair, argv, words):
    err = io.StringIO()
    assert serve_cli.main(argv, load=loader(pair), stderr=err) == 2
    assert err.getvalue().startswith("specchat serve: error: ") and words in err.getvalue()
    assert err.getvalue().count("\n") == 1


def test_an_address_in_use_is_one_line_before_the_models_load(pair):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        err, calls = io.StringIO(), len(pair.progress_calls)
        assert serve_cli.main(["--port", str(port)], load=loader(pair), stderr=err) == 2
    assert err.getvalue().startswith(f"specchat serve: error: cannot listen on 127.0.0.1:{port}: ")
    assert len(pair.progress_calls) == calls  # nothing was loaded
