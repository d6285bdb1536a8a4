"""The loopback model server itself: routes, auth and each injected fault, seen through a plain client."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.fake_server import FakeServer, Fault

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One HTTP answer as a plain standard-library client read it."""

    status_code: int
    headers: http.client.HTTPMessage
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def post(url: str, body: Any, *, headers: dict[str, str] | None = None, timeout: float = 5.0) -> Answer:
    """POST ``body`` as JSON over a fresh connection with ``http.client`` and read the whole answer."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request(
            "POST", parts.path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        text = response.read().decode("utf-8")
        return Answer(status_code=response.status, headers=response.headers, text=text)
    finally:
        conn.close()


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
    response = post(server.base_url + "/chat/completions", BODY)
    assert response.status_code == status and check(response)


@pytest.mark.parametrize("fault", [Fault.cut(), Fault.drop()], ids=["cut", "drop"])
def test_broken_connections(server, fault):
    """cut sends half a body and drop sends nothing: the client sees a protocol error either way."""
    server.queue_faults(fault)
    with pytest.raises(http.client.HTTPException):
        post(server.base_url + "/chat/completions", BODY)
    assert post(server.base_url + "/chat/completions", BODY).status_code == 200


def test_stall_outlasts_a_short_timeout(server):
    """A stall keeps the answer back past the client's read timeout."""
    server.queue_faults(Fault.stall(1.0))
    with pytest.raises(TimeoutError):
        post(server.base_url + "/chat/completions", BODY, timeout=0.2)


def test_auth_routes_and_ollama_shape():
    """A wrong key gets 401, an unknown path 404, and /api/chat answers in Ollama's shape."""
    with FakeServer(api_key="k") as server:
        assert post(server.base_url + "/chat/completions", BODY).status_code == 401
        ok = post(server.base_url + "/chat/completions", BODY, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200
        assert post(server.host + "/v1/embeddings", BODY).status_code == 404
        ollama = post(
            server.host + "/api/chat",
            {**BODY, "options": {"seed": 4}},
            headers={"Authorization": "Bearer k"},
        ).json()
        assert ollama["message"]["content"] == "reply to: hi seed=4" and ollama["done"] is True
        assert [r.path for r in server.received] == ["/v1/chat/completions"] * 2 + [
            "/v1/embeddings",
            "/api/chat",
        ]
        assert json.loads(json.dumps(server.received[-1].json)) == {**BODY, "options": {"seed": 4}}


def test_trickle_sends_the_whole_answer_slowly(server):
    """A trickled answer is complete and correct, and no single read waits longer than a short timeout."""
    server.queue_faults(Fault.trickle(0.8))
    response = post(server.base_url + "/chat/completions", BODY, timeout=0.4)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "reply to: hi"


def test_command_serves_in_the_background_until_sigterm(tmp_path):
    """`python -m tests.support.fake_server --port P &` keeps serving with no stdin, and SIGTERM stops it cleanly."""
    import json
    import signal
    import subprocess
    import sys
    import urllib.request

    # A background job of a non-interactive shell has /dev/null as stdin, as here.
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_server", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        for _ in range(2):  # still there after the first answer
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.loads(response.read())
            assert answer["choices"][0]["message"]["content"] == "reply to: hi"
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _seed(i: int) -> dict[str, Any]:
    required = ["red ball", "kite", "apple tree", "blue boat"][: 2 + i % 3]
    return {
        "id": f"ts-{i:06d}",
        "split": "train",
        "protagonist": "a shy turtle named Tim",
        "theme": "friendship",
        "required": required,
        "banned": ["forest"],
        "min_sentences": 4,
        "max_sentences": 6,
    }


def test_story_replies_vary_with_the_request_and_some_fail_the_checks():
    """replies="story" (the command's default) answers a TinyStories prompt with a made-up story
    chosen by the request: the same request gets the same story, and over many seeds some pass
    the seed's checks and some fail them, so a documented sweep over the server shows something."""
    from storyforge.tasks.tinystories import render_instruction, validate_output

    with FakeServer(replies="story") as story_server:
        outputs: list[tuple[dict[str, Any], str]] = []
        for i in range(60):
            seed = _seed(i)
            body = {
                "model": "m",
                "seed": i,
                "messages": [{"role": "user", "content": render_instruction(seed)}],
            }
            text = post(story_server.base_url + "/chat/completions", body).json()["choices"][0]["message"][
                "content"
            ]
            outputs.append((seed, text))
        again = post(story_server.base_url + "/chat/completions", body).json()["choices"][0]["message"][
            "content"
        ]
    assert again == outputs[-1][1]
    assert len({text for _, text in outputs}) > len(outputs) // 2
    results = [validate_output(seed, text) for seed, text in outputs]
    passed = sum(r.passed for r in results)
    assert 0 < passed < len(results)
    labels = {label for r in results for label in r.labels}
    assert {"missing_required", "wrong_sentence_count"} <= labels


VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["pass", "fail"]},
        "rule": {"type": "string"},
        "reason": {"type": "string"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["verdict", "rule", "reason"],
    "additionalProperties": False,
}


def _content(answer: Answer) -> str:
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def test_story_is_the_default_and_echo_an_option():
    """FakeServer() answers a TinyStories prompt with a story; replies="echo" echoes every prompt."""
    from storyforge.tasks.tinystories import render_instruction

    body = {"model": "m", "messages": [{"role": "user", "content": render_instruction(_seed(1))}]}
    with FakeServer() as default, FakeServer(replies="echo") as echo:
        story = _content(post(default.base_url + "/chat/completions", body))
        echoed = _content(post(echo.base_url + "/chat/completions", body))
    assert story.startswith("Once upon a time") and "Protagonist" not in story
    assert echoed == "reply to: " + render_instruction(_seed(1))


def test_a_repair_conversation_gets_a_new_story_not_an_echo():
    """The repair turn after a failed answer is answered with a story for the original
    instruction (passing or failing), never with the repair turn repeated."""
    from storyforge.tasks.tinystories import render_instruction

    with FakeServer() as server:
        texts = []
        for i in range(20):
            first = {"role": "user", "content": render_instruction(_seed(i))}
            body = {
                "model": "m",
                "seed": i,
                "messages": [
                    first,
                    {"role": "assistant", "content": "A short try."},
                    {
                        "role": "user",
                        "content": 'Your story does not follow the constraints yet. It does not contain "lantern".',
                    },
                ],
            }
            texts.append(_content(post(server.base_url + "/chat/completions", body)))
    assert all(text.startswith("Once upon a time") for text in texts)
    assert not any("constraints" in text or "reply to" in text for text in texts)
    assert len(set(texts)) > 10


@pytest.mark.parametrize(
    ("field", "wrap"),
    [
        ("response_format", lambda s: {"type": "json_schema", "json_schema": {"name": "v", "schema": s}}),
        ("json_schema", lambda s: s),
    ],
)
def test_judge_requests_get_schema_valid_verdicts_some_failing(field, wrap):
    """A request asking for JSON under a schema gets a verdict valid under it; a share fails."""
    from jsonschema import Draft202012Validator

    with FakeServer(judge_fail=0.3) as server:
        verdicts = []
        for seed in range(40):
            body = {
                "model": "m",
                "seed": seed,
                "messages": [{"role": "user", "content": "Judge this story: Once upon a time."}],
                field: wrap(VERDICT_SCHEMA),
            }
            verdicts.append(json.loads(_content(post(server.base_url + "/chat/completions", body))))
    for verdict in verdicts:
        assert not list(Draft202012Validator(VERDICT_SCHEMA).iter_errors(verdict)), verdict
    failed = [v for v in verdicts if v["verdict"] == "fail"]
    assert 0 < len(failed) < len(verdicts)
    assert all(v["rule"] != "none" for v in failed)


def test_ollama_format_requests_get_verdicts_and_broken_json_on_request():
    """Ollama's ``format`` schema is honoured too, and judge_broken=1 cuts every verdict's JSON."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Judge this."}],
        "format": VERDICT_SCHEMA,
    }
    with FakeServer() as server, FakeServer(judge_broken=1.0) as broken:
        whole = post(server.host + "/api/chat", body).json()["message"]["content"]
        cut = post(broken.host + "/api/chat", body).json()["message"]["content"]
    assert json.loads(whole)["verdict"] in ("pass", "fail")
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut)


@pytest.mark.parametrize("messages", [[], ["not an object"]])
def test_empty_or_malformed_messages_are_a_400(server, messages):
    answer = post(server.base_url + "/chat/completions", {"model": "m", "messages": messages})
    assert answer.status_code == 400
    assert "messages" in answer.json()["error"]["message"]


def test_content_given_as_parts_is_read_as_its_text():
    """``[{"type": "text", "text": ...}]`` content is the instruction the story answers."""
    from storyforge.tasks.tinystories import render_instruction

    text = render_instruction(_seed(3))
    half = len(text) // 2
    parts = [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}]
    as_parts = {"model": "m", "seed": 3, "messages": [{"role": "user", "content": parts}]}
    with FakeServer() as server:
        story = _content(post(server.base_url + "/chat/completions", as_parts))
        hi = {**BODY, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
        echo = _content(post(server.base_url + "/chat/completions", hi))
    assert story.startswith(f"Once upon a time there was {_seed(3)['protagonist']}.")
    assert echo == "reply to: hi"


def test_cut_off_stories_end_with_finish_reason_length():
    """cut_off=1: every story stops at a word before its end, with finish_reason "length"."""
    from storyforge.tasks.tinystories import render_instruction

    body = {"model": "m", "messages": [{"role": "user", "content": render_instruction(_seed(2))}]}
    with FakeServer(cut_off=1.0) as server, FakeServer() as whole:
        choice = post(server.base_url + "/chat/completions", body).json()["choices"][0]
        full = post(whole.base_url + "/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and full["finish_reason"] == "stop"
    cut = choice["message"]["content"]
    assert full["message"]["content"].startswith(cut) and len(cut) < len(full["message"]["content"])
