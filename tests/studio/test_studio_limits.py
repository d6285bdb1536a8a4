"""The studio under load it did not ask for, over real HTTP: slow renders, huge answers, idle and doubled-header requests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from studio_support import Reply, Running, start_studio, stop_studio

from storyforge.studio.worker import Worker

TINY = (Path(__file__).resolve().parent / "tiny_turn.yaml").read_text(encoding="utf-8")
CONTEXT = {"actor": {"name": "Iris"}}


def _slow_estimator(text: str) -> int:
    """A token counter that never finishes (a stand-in for any render too heavy to wait for)."""
    if "Iris" in text:
        time.sleep(3600)
    return len(text) // 4


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A studio whose renders stop after 1 s, whose answers are at most 3,000 bytes, and whose
    connections must send their headers within 0.5 s."""
    db = tmp_path_factory.mktemp("limits") / "store.db"
    running, server, thread = start_studio(
        f"sqlite:///{db}",
        estimator=_slow_estimator,
        worker=Worker(time_limit_s=1.0, max_response_bytes=3000, slots=2),
        header_timeout_s=0.5,
    )
    try:
        yield running
    finally:
        stop_studio(server, thread)


def test_a_render_past_the_time_limit_is_answered_with_the_limit_error(limited: Running) -> None:
    """The render is stopped and the page gets a 422 saying which limit, not a hung request."""
    reply = limited.post("/api/render", {"template": TINY, "context": CONTEXT})
    assert reply.status == 422
    body = reply.json()
    assert body["limit"] is True
    assert body["error"].startswith("the work ran past the studio's time limit of 1s and was stopped")


def test_other_requests_are_served_while_a_render_runs(limited: Running) -> None:
    """While a render is stuck in its worker, the store listing and the info are answered."""
    stuck: list[Reply] = []
    render = threading.Thread(
        target=lambda: stuck.append(limited.post("/api/render", {"template": TINY, "context": CONTEXT}))
    )
    render.start()
    try:
        answered = [limited.get("/api/info").status, limited.get("/api/templates").status]
        still_rendering = render.is_alive()
    finally:
        render.join(timeout=60)
    assert answered == [200, 200]
    assert still_rendering  # the answers came while the render was running
    assert stuck and stuck[0].status == 422


def test_an_answer_larger_than_the_cap_is_replaced_by_the_limit_error(limited: Running) -> None:
    """A render whose JSON answer passes the size cap is refused in the worker, with its size."""
    reply = limited.post("/api/render", {"template": TINY, "context": {"actor": {"name": "x" * 5000}}})
    assert reply.status == 422
    assert "more than the studio sends (3,000)" in reply.json()["error"]


def test_check_runs_in_the_worker_too(limited: Running) -> None:
    """A check still answers normally through the worker."""
    reply = limited.post("/api/check", {"template": TINY})
    assert reply.status == 200 and reply.json()["ok"] is True


@pytest.mark.parametrize("header", ["Origin", "Host"])
def test_a_request_with_two_origin_or_host_headers_is_refused(limited: Running, header: str) -> None:
    """Two Origin (or Host) headers: which one would count? 403, whatever their values."""
    own = f"127.0.0.1:{limited.port}"
    value = f"http://{own}" if header == "Origin" else own
    request = (
        f"POST /api/check HTTP/1.1\r\nHost: {own}\r\n"
        + (f"{header}: {value}\r\n" * (2 if header == "Origin" else 1))
        + (f"Host: {own}\r\n" if header == "Host" else "")
        + "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        sock.sendall(request.encode())
        answer = _read_all(sock)
    status = int(answer.split(b" ", 2)[1])
    assert status in (400, 403), answer[:300]
    if header == "Origin":
        assert status == 403 and b"more than one origin header" in answer


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"], ids=["idle", "half-a-head"])
def test_a_connection_that_sends_no_whole_head_is_closed(limited: Running, sent: bytes) -> None:
    """An idle connection, or one that stops halfway through its headers, is closed by the server."""
    with socket.create_connection(("127.0.0.1", limited.port), timeout=60) as sock:
        sock.sendall(sent)
        assert _read_all(sock) == b""  # closed by the server, with nothing sent


def test_a_slow_answer_is_not_cut_by_the_header_timeout(limited: Running) -> None:
    """The header timer never closes a connection whose request is being answered (the render takes > 1 s)."""
    reply: Any = limited.post("/api/render", {"template": TINY, "context": CONTEXT})
    assert reply.status == 422  # the worker's own limit answered, over the same connection
