"""The studio's safety rules over real HTTP: Host, Origin, body size; and the command itself."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from studio_support import ROOT, Running, studio_command

from storyforge.cli import build_parser
from storyforge.providers.llama_server import free_port
from storyforge.studio.server import MAX_BODY

TINY = (Path(__file__).resolve().parent / "tiny_turn.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1",
        "127.0.0.1:1",
        "localhost:{port}.evil.example",
        "0.0.0.0:{port}",
        "[::1]:{port}",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_foreign_host_header_is_refused(studio: Running, host: str, method: str) -> None:
    """Any Host but 127.0.0.1:PORT or localhost:PORT is a 403 (no DNS rebinding)."""
    sent = host.format(port=studio.port)
    body = {"template": TINY} if method == "POST" else None
    reply = studio.request(
        method, "/api/templates" if method == "POST" else "/", body, headers={"Host": sent}
    )
    assert reply.status == 403
    assert reply.json() == {
        "error": f"refused: the Host header {sent!r} is not this studio's (127.0.0.1:{studio.port})"
    }


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}"])
def test_the_studio_own_host_names_are_served(studio: Running, host: str) -> None:
    """127.0.0.1:PORT and localhost:PORT both reach the page."""
    assert studio.get("/", headers={"Host": host.format(port=studio.port)}).status == 200


def test_a_request_without_host_is_refused(studio: Running) -> None:
    """An HTTP/1.0 request with no Host header at all is refused."""
    conn = http.client.HTTPConnection("127.0.0.1", studio.port, timeout=30)
    try:
        conn._http_vsn_str = "HTTP/1.0"  # type: ignore[attr-defined]
        conn.putrequest("GET", "/api/info", skip_host=True)
        conn.endheaders()
        assert conn.getresponse().status == 403
    finally:
        conn.close()


@pytest.mark.parametrize(
    "origin",
    ["http://evil.example", "null", "http://127.0.0.1:1", "https://127.0.0.1:{port}", "http://localhost"],
)
def test_a_post_from_another_origin_is_refused_and_changes_nothing(studio: Running, origin: str) -> None:
    """A POST whose Origin is not the page's own is a 403, and nothing is saved."""
    sent = origin.format(port=studio.port)
    before = studio.get("/api/templates").json()
    reply = studio.post("/api/templates", {"template": TINY}, headers={"Origin": sent})
    assert reply.status == 403
    assert reply.json() == {"error": f"refused: a POST from origin {sent!r}, not this page's"}
    assert studio.get("/api/templates").json() == before


@pytest.mark.parametrize("origin", ["http://127.0.0.1:{port}", "http://localhost:{port}", None])
def test_a_post_from_the_page_itself_is_served(studio: Running, origin: str | None) -> None:
    """The page's own origin, or no Origin at all (a command-line client), may POST."""
    headers = {} if origin is None else {"Origin": origin.format(port=studio.port)}
    reply = studio.post("/api/check", {"template": TINY}, headers=headers)
    assert reply.status == 200
    assert reply.json()["ok"] is True


def test_a_body_larger_than_the_cap_is_refused(studio: Running) -> None:
    """A body over MAX_BODY bytes is a 413, whether announced by Content-Length or not."""
    big = b'{"template": "' + b"x" * MAX_BODY + b'"}'
    reply = studio.post("/api/render", raw=big)
    assert reply.status == 413
    assert reply.json() == {"error": f"refused: the request body is larger than {MAX_BODY} bytes"}


def test_a_chunked_body_is_cut_off_at_the_cap(studio: Running) -> None:
    """A body sent without Content-Length (chunked) is refused with 413 once it passes the cap."""
    piece = b"x" * 65536
    chunks = [b'{"template": "'] + [piece] * (MAX_BODY // len(piece) + 1) + [b'"}']
    conn = http.client.HTTPConnection("127.0.0.1", studio.port, timeout=30)
    try:
        conn.request(
            "POST",
            "/api/render",
            body=iter(chunks),
            headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            encode_chunked=True,
        )
        response = conn.getresponse()
        assert response.status == 413
        assert (
            response.read()
            == f'{{"error": "refused: the request body is larger than {MAX_BODY} bytes"}}'.encode()
        )
    finally:
        conn.close()


def test_the_command_binds_loopback_prints_the_url_and_serves(tmp_path: Path) -> None:
    """`storyforge studio` prints its URL, answers on 127.0.0.1, and stops on Ctrl-C (exit 130)."""
    with studio_command(tmp_path) as (running, proc, first):
        assert first == (
            f"storyforge studio: http://127.0.0.1:{running.port}/ (store {running.store_url}; Ctrl-C stops it)\n"
        )
        info = running.get("/api/info").json()
        assert (info["store"], info["estimator"]) == (running.store_url, "ceil(len/4)")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.splitlines()[-1] == "interrupted"


def test_the_command_exits_130_when_interrupted_as_soon_as_it_prints_its_url(tmp_path: Path) -> None:
    """Ctrl-C right after the URL line (the server may still be starting) is exit 130 too."""
    with studio_command(tmp_path, wait=False) as (_, proc, first):
        assert first.startswith("storyforge studio: http://127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.splitlines()[-1] == "interrupted"


def test_ctrl_c_at_any_moment_after_the_url_stops_the_server_with_keyboard_interrupt(
    tmp_path: Path,
) -> None:
    """From the moment the URL is printed SIGINT only marks the studio interrupted: code running
    then (here a dataclass being built, which runs ``exec``, as uvicorn's imports do) goes on,
    the server never serves, and :func:`serve` ends in KeyboardInterrupt with Python's handler
    back in place. (Raised inside ``exec``, Python's KeyboardInterrupt made the process end as
    killed by SIGINT instead of with 130.)"""
    import dataclasses

    from storyforge.store import TemplateStore
    from storyforge.studio import Studio
    from storyforge.studio.server import bind, serve

    went_on = []

    def ready() -> None:
        signal.raise_signal(signal.SIGINT)  # handled at once, in this thread
        went_on.append(dataclasses.make_dataclass("Built", ["a"], frozen=True))

    with TemplateStore(f"sqlite:///{tmp_path / 'store.db'}") as store, bind(free_port()) as sock:
        with pytest.raises(KeyboardInterrupt):
            serve(Studio(store=store), sock, ready=ready)
        with pytest.raises(ConnectionRefusedError):  # bound, never listening
            socket.create_connection(sock.getsockname(), timeout=5).close()
    assert len(went_on) == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_command_counts_tokens_with_a_local_tokenizer(tmp_path: Path) -> None:
    """--tokenizer FILE makes every message's token count come from that tokenizer."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"[UNK]": 0, "You": 1, "are": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with studio_command(tmp_path, "--tokenizer", str(tmp_path / "tokenizer.json")) as (running, _, _):
        assert running.get("/api/info").json()["estimator"] == "tokenizer tokenizer.json"
        body = running.post(
            "/api/render", {"template": TINY, "context": {"actor": {"name": "Iris Calloway"}}}
        ).json()
    system = body["messages"][0]
    assert system["content"] == "You are Iris Calloway."
    assert system["tokens"] == 5  # You, are, Iris, Calloway, "." (whitespace and punctuation split)


def test_the_command_fails_in_one_line_when_the_port_is_taken(tmp_path: Path) -> None:
    """A port already in use is exit 1 with one error line, and no URL is printed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "storyforge.cli",
                "--store",
                f"sqlite:///{tmp_path / 's.db'}",
                "studio",
                "--port",
                str(port),
            ],
            check=False,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_the_command_line_accepts_store_before_and_after() -> None:
    """--store may stand before the subcommand or after it; --port is checked."""
    args = build_parser(["studio"]).parse_args(["--store", "sqlite:///a.db", "studio", "--port", "9000"])
    assert (args.store, args.port, args.tokenizer) == ("sqlite:///a.db", 9000, None)
    args = build_parser(["studio"]).parse_args(["studio", "--store", "sqlite:///b.db"])
    assert (args.store, args.port) == ("sqlite:///b.db", 8765)
    with pytest.raises(SystemExit):
        build_parser(["studio"]).parse_args(["studio", "--port", "70000"])
