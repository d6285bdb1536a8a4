"""The loopback model server itself: routes, auth and each injected fault, seen through a plain client."""

from __future__ import annotations

import json

import httpx
import pytest

from storyforge.testing.fake_server import FakeServer, Fault

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("fault", "status", "check"),
    [
        (Fault.http(503, "busy"), 503, lambda r: r.json() == {"error": {"message": "busy"}}),
        (Fault.rate_limited("7"), 429, lambda r: r.headers["retry-after"] == "7"),
        (Fault.malformed(), 200, lambda r: r.text == '{"choices": [{"message": '),
        (None, 200, lambda r: r.json()["choices"][0]["message"]["content"] == "reply to: hi"),
    ],
    ids=["status", "retry-after", "malformed", "normal"],
)
def test_answers(server, fault, status, check):
    """Each answering fault (and no fault) gives the promised status and body."""
    if fault is not None:
        server.queue_faults(fault)
    response = httpx.post(server.base_url + "/chat/completions", json=BODY)
    assert response.status_code == status and check(response)


@pytest.mark.parametrize("fault", [Fault.cut(), Fault.drop()], ids=["cut", "drop"])
def test_broken_connections(server, fault):
    """cut sends half a body and drop sends nothing: the client sees a protocol error either way."""
    server.queue_faults(fault)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(server.base_url + "/chat/completions", json=BODY)
    assert httpx.post(server.base_url + "/chat/completions", json=BODY).status_code == 200


def test_stall_outlasts_a_short_timeout(server):
    """A stall keeps the answer back past the client's read timeout."""
    server.queue_faults(Fault.stall(1.0))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/chat/completions", json=BODY, timeout=0.2)


def test_auth_routes_and_ollama_shape():
    """A wrong key gets 401, an unknown path 404, and /api/chat answers in Ollama's shape."""
    with FakeServer(api_key="k") as server:
        assert httpx.post(server.base_url + "/chat/completions", json=BODY).status_code == 401
        ok = httpx.post(
            server.base_url + "/chat/completions", json=BODY, headers={"Authorization": "Bearer k"}
        )
        assert ok.status_code == 200
        assert httpx.post(server.host + "/v1/embeddings", json=BODY).status_code == 404
        ollama = httpx.post(
            server.host + "/api/chat",
            json={**BODY, "options": {"seed": 4}},
            headers={"Authorization": "Bearer k"},
        ).json()
        assert ollama["message"]["content"] == "reply to: hi seed=4" and ollama["done"] is True
        assert [r.path for r in server.received] == ["/v1/chat/completions"] * 2 + [
            "/v1/embeddings",
            "/api/chat",
        ]
        assert json.loads(json.dumps(server.received[-1].json)) == {**BODY, "options": {"seed": 4}}
