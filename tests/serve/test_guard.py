"""specchat serve on a desktop: a web page the user visits cannot use it (Host checked against DNS rebinding,
cross-origin requests refused unless --cors allows them, a JSON content type required); routes a client gets wrong
are OpenAI-shaped JSON; every request is one access-log line."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from test_server import ASK, LOCAL, started
from tinypair import tiny_pair

from specchat.serve.guard import Guard, host_name

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def pair(tokenizer, target, similar_drafter_model):
    return tiny_pair(tokenizer, target, similar_drafter_model)


@pytest.fixture()
def client(pair):
    app, _ = started(pair, "--cors", "http://localhost:5173", "--allow-host", "box.lan")
    return TestClient(app, base_url=LOCAL)


@pytest.mark.parametrize(
    "host, answered",
    [
        ("127.0.0.1:8080", True),
        ("localhost:8080", True),
        ("[::1]:8080", True),
        ("192.168.1.20:8080", True),  # an address: no rebinding page can send one
        ("box.lan:8080", True),  # --allow-host
        ("BOX.LAN.", True),
        ("attacker.example:8080", False),
        ("localhost.attacker.example", False),
        ("", False),
    ],
)
def test_only_loopback_addresses_and_allowed_names_are_answered(client, host, answered):
    reply = client.get("/v1/models", headers={"Host": host})
    assert reply.status_code == (200 if answered else 403), reply.text
    if not answered:
        assert "--allow-host" in reply.json()["error"]["message"]


def test_a_web_page_s_simple_cross_origin_post_runs_nothing(client, pair):
    service = client.app.state.service
    replies = sum(service.finished.values())
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    reply = client.post(CHAT, content=b'{"messages": [{"role": "user", "content": "hi"}]}', headers=evil)
    assert reply.status_code == 403 and "--cors" in reply.json()["error"]["message"]
    assert "access-control-allow-origin" not in reply.headers
    preflight = client.options(CHAT, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403
    assert sum(service.finished.values()) == replies  # no reply ran


def test_an_origin_allowed_by_cors_gets_its_preflight_and_its_reply(client):
    origin = {"Origin": "http://localhost:5173"}
    preflight = client.options(CHAT, headers={**origin, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "Content-Type" in preflight.headers["access-control-allow-headers"]
    reply = client.post(CHAT, json={**ASK, "max_tokens": 2}, headers=origin)
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "http://localhost:5173"


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_a_post_that_is_not_json_is_a_415(client, kind):
    headers = {"Content-Type": kind} if kind else {}
    reply = client.post(CHAT, content=b'{"messages": [{"role": "user", "content": "hi"}]}', headers=headers)
    assert reply.status_code == 415 and "application/json" in reply.json()["error"]["message"]
    typed = {"Content-Type": "application/json; charset=utf-8"}
    assert client.post(CHAT, json={**ASK, "max_tokens": 2}, headers=typed).status_code == 200


def test_unknown_routes_and_methods_are_openai_shaped_json(client):
    missing = client.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no route '/v1/nothing'"
    wrong = client.get(CHAT)
    assert wrong.status_code == 405 and "GET is not allowed" in wrong.json()["error"]["message"]
    assert client.get("/v1/models/tiny-target").json() == {
        "id": "tiny-target",
        "object": "model",
        "created": 0,
        "owned_by": "specchat",
    }
    other = client.get("/v1/models/gpt-4o")
    assert other.status_code == 404 and "tiny-target" in other.json()["error"]["message"]


def test_every_request_is_one_access_log_line_with_the_reply_s_figures(pair, capfd):
    app, _ = started(pair)
    client = TestClient(app, base_url=LOCAL)
    capfd.readouterr()
    client.post(CHAT, json=ASK)
    with client.stream("POST", CHAT, json={**ASK, "stream": True}) as streamed:
        list(streamed.iter_lines())
    client.get("/v1/nothing")
    client.post(CHAT, json={**ASK, "temperature": -1})
    client.get("/v1/models", headers={"Host": "attacker.example"})
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 5, lines
    whole, stream, missing, bad, rebound = lines
    assert " GET /v1/models 403" in rebound
    for line in (whole, stream):
        assert " POST /v1/chat/completions 200 · " in line and " tokens · " in line
        assert " · steps " in line and " copied/" in line and line.endswith(" s")
    assert " GET /v1/nothing 404" in missing and " POST /v1/chat/completions 400" in bad


def test_host_names_are_read_without_port_or_brackets():
    assert host_name("LocalHost:8080") == "localhost" and host_name("[::1]:80") == "::1" and host_name("::1") == "::1"
    guard = Guard.of("0.0.0.0", ["*"], [])
    assert guard.host_allowed("anything.example") and not Guard.of("127.0.0.1", [], []).host_allowed("x.example")
