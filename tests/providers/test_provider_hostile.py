"""Truthful runs against servers that misbehave on purpose, through the documented command line.

Each case starts a real HTTP server on loopback (the standard library's, so it shares no code
with the providers or the fake server) and runs ``python run.py`` in a subprocess: the exit
status, the one line on stderr and the files left behind are what a user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import pytest
from provider_support import REPO

from storyforge.errors import EXIT_CODES
from storyforge.providers.llama_server import free_port

Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Hostile:
    """A loopback HTTP server whose answer to each POST is ``answer(n, body)``."""

    answer: Callable[[int, dict[str, Any]], Reply]
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def __enter__(self) -> Self:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with owner.lock:
                    owner.requests += 1
                    n = owner.requests
                status, headers, payload = owner.answer(n, body)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                    if headers.get("X-Stream-Bytes"):
                        block = b"x" * (1 << 20)
                        for _ in range(int(headers["X-Stream-Bytes"]) >> 20):
                            self.wfile.write(block)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def completion(body: dict[str, Any], text: str = "Once upon a time, Mia found a red kite.") -> Reply:
    """A well-formed chat completion for ``body``, answered by the model it asked for."""
    payload = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
    }
    return 200, {"Content-Type": "application/json"}, json.dumps(payload).encode()


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    payload = json.dumps({"error": {"message": message, "type": "server_error"}}).encode()
    return status, {"Content-Type": "application/json", **(headers or {})}, payload


def run_py(
    run_dir: Path, *overrides: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    defaults = {
        "task.n_seeds": "6",
        "provider.progress": "false",
        "provider.backoff_base_s": "0.01",
        "provider.backoff_max_s": "0.05",
    }
    given = {item.split("=", 1)[0] for item in overrides}
    cmd = [
        sys.executable,
        "run.py",
        "task=tinystories",
        *(f"{key}={value}" for key, value in defaults.items() if key not in given),
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    full_env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    full_env.update(env or {})
    return subprocess.run(  # noqa: PLW1510 - the exit status is asserted
        cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=180
    )


def openai(server: Hostile | str, *more: str) -> list[str]:
    url = server if isinstance(server, str) else server.base_url
    return ["provider=openai", "provider.model=tiny", f"provider.base_url={url}", *more]


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line: the last line on stderr, and no traceback anywhere."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), result.stderr[-2000:]
    return lines[-1]


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "generations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A loopback port with nothing listening (bound, then closed)."""
    yield f"http://127.0.0.1:{free_port()}/v1"


@pytest.mark.slow
def test_dead_base_url_stops_early_with_a_server_error(tmp_path, dead_url):
    """Nothing listening: the run stops once fail_fast_s has passed with no answer, exit 4."""
    result = run_py(
        tmp_path / "run",
        *openai(dead_url, "provider.fail_fast_s=1", "task.n_seeds=64", "provider.backoff_base_s=0.5"),
    )
    assert result.returncode == EXIT_CODES["server"]
    line = error_line(result)
    assert f"no answer from {dead_url}/chat/completions" in line
    assert "connection failed" in line and "provider.base_url" in line
    # it stopped early: far fewer than the 64 requests were given up on
    assert len(records(tmp_path / "run")) < 64


@pytest.mark.slow
def test_server_answering_500_to_everything_stops_early(tmp_path):
    with Hostile(lambda n, body: error(500, "model worker crashed")) as server:
        result = run_py(tmp_path / "run", *openai(server, "provider.fail_fast_s=1", "task.n_seeds=64"))
    assert result.returncode == EXIT_CODES["server"]
    line = error_line(result)
    assert "HTTP 500" in line and "model worker crashed" in line


@pytest.mark.slow
def test_huge_retry_after_is_capped(tmp_path):
    """Retry-After: 999999 on the first answer is waited for at most max_retry_after_s."""

    def answer(n: int, body: dict[str, Any]) -> Reply:
        return error(429, "slow down", {"Retry-After": "999999"}) if n == 1 else completion(body)

    with Hostile(answer) as server:
        result = run_py(tmp_path / "run", *openai(server, "provider.max_retry_after_s=0.2", "task.n_seeds=3"))
        assert server.requests == 4
    assert result.returncode == 0, result.stderr[-2000:]
    assert "max_retry_after_s" in result.stdout + result.stderr
    assert [r.get("error") for r in records(tmp_path / "run")] == [None] * 3


@pytest.mark.slow
def test_oversized_answer_is_refused_and_recorded(tmp_path):
    """A 100 MB body is cut off at max_response_bytes and recorded as an error, never kept."""

    def answer(n: int, body: dict[str, Any]) -> Reply:
        if n == 2:
            size = 100 << 20
            headers = {"Content-Type": "application/json", "Content-Length": str(size + 1)}
            return 200, {**headers, "X-Stream-Bytes": str(size)}, b"{"
        return completion(body)

    with Hostile(answer) as server:
        result = run_py(
            tmp_path / "run",
            *openai(server, "provider.concurrency=1", "provider.max_response_bytes=65536", "task.n_seeds=4"),
        )
        # not retried, and the rest not sent: 1 failure of 4 is already over the default limit
        assert server.requests == 2
    run_dir = tmp_path / "run"
    errors = [r["error"] for r in records(run_dir) if r.get("error")]
    assert len(errors) == 1 and "provider.max_response_bytes" in errors[0]
    assert (run_dir / "generations.jsonl").stat().st_size < 65536
    assert result.returncode == EXIT_CODES["server"]
    assert "max_error_rate" in error_line(result)
    assert not (run_dir / "validated.jsonl").exists()


@pytest.mark.slow
def test_an_answer_that_is_not_text_is_recorded_as_malformed_and_the_run_goes_on(tmp_path):
    """A completion holding an unpaired surrogate (valid JSON, not Unicode text) is an error
    for that prompt, recorded like any malformed answer; every file is still written."""

    def answer(n: int, body: dict[str, Any]) -> Reply:
        if n == 2:
            status, headers, payload = completion(body, "Mia ran. BROKEN")
            return status, headers, payload.replace(b"BROKEN", b"\\ud800")
        return completion(body)

    with Hostile(answer) as server:
        result = run_py(
            tmp_path / "run",
            *openai(
                server,
                "provider.concurrency=1",
                "provider.max_retries=0",
                "provider.max_error_rate=0.5",
                "task.n_seeds=4",
            ),
        )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "run"
    errors = [r["error"] for r in records(run_dir) if r.get("error")]
    assert len(errors) == 1 and "unpaired surrogate \\ud800" in errors[0]
    validated = [json.loads(line) for line in (run_dir / "validated.jsonl").read_text("utf-8").splitlines()]
    assert len(validated) == 4 and sum(v["error"] is not None for v in validated) == 1


@pytest.mark.slow
def test_redirect_is_not_followed(tmp_path):
    """A 307 to another port is reported with its Location; the other server never sees a request."""
    with Hostile(lambda n, body: completion(body)) as elsewhere:
        target = elsewhere.base_url + "/chat/completions"
        with Hostile(lambda n, body: (307, {"Location": target}, b"")) as server:
            result = run_py(
                tmp_path / "run",
                *openai(server, "provider.api_key_env=SF_HOSTILE_KEY"),
                env={"SF_HOSTILE_KEY": "sk-hostile-1"},
            )
        assert elsewhere.requests == 0
    assert result.returncode == EXIT_CODES["server"]
    line = error_line(result)
    assert "307" in line and target in line


@pytest.mark.slow
def test_error_rate_stops_the_run_once_the_limit_is_certain(tmp_path):
    """A third of the prompts always fail: exit 4 by default as soon as the failures exceed
    what the limit allows over the run's 12 requests (no exports), 0 when max_error_rate allows it."""

    def answer(n: int, body: dict[str, Any]) -> Reply:
        text = json.dumps(body["messages"])
        return error(503, "overloaded") if sum(map(ord, text)) % 3 == 0 else completion(body)

    with Hostile(answer) as server:
        strict = run_py(
            tmp_path / "a",
            *openai(server, "provider.max_retries=1", "provider.concurrency=1", "task.n_seeds=12"),
        )
        lenient = run_py(
            tmp_path / "b",
            *openai(server, "provider.max_retries=1", "task.n_seeds=12", "provider.max_error_rate=0.9"),
        )
    failed = [r for r in records(tmp_path / "a") if r.get("error")]
    assert len(failed) == 1  # 1 of at most 12 is over 5%: the run stops there
    assert strict.returncode == EXIT_CODES["server"]
    assert "1 request(s) failed after every retry, of at most 12" in error_line(strict)
    assert "max_error_rate" in error_line(strict)
    assert not (tmp_path / "a" / "sft.jsonl").exists()
    assert lenient.returncode == 0, lenient.stderr[-2000:]
    lenient_failed = [r for r in records(tmp_path / "b") if r.get("error")]
    assert 0 < len(lenient_failed) < 12 and (tmp_path / "b" / "sft.jsonl").exists()


@pytest.mark.parametrize(
    ("overrides", "env", "code", "expected"),
    [
        (
            ["provider=openai", "provider.model=tiny", "provider.api_key_env=SF_NOT_SET_ANYWHERE"],
            {},
            "config",
            "SF_NOT_SET_ANYWHERE",
        ),
        (["provider=openai"], {}, "config", "provider.model is required"),
        (
            ["provider=openai", "provider.model=tiny", "provider.max_error_rate=2"],
            {},
            "config",
            "provider.max_error_rate",
        ),
        (["constraints.min_sentences=9", "constraints.max_sentences=3"], {}, "config", "min_sentences"),
        (["seeds_path=/nonexistent/seeds.jsonl"], {}, "config", "seeds_path: no such file"),
    ],
)
def test_user_errors_print_one_line_and_write_nothing(tmp_path, overrides, env, code, expected):
    """Errors a user can cause: one line, an exit status by kind, and no files in the run dir."""
    run_dir = tmp_path / "run"
    result = run_py(run_dir, *overrides, env={**env, "SF_NOT_SET_ANYWHERE": ""})
    assert result.returncode == EXIT_CODES[code], result.stderr[-2000:]
    assert expected in error_line(result)
    assert not any(p.suffix == ".jsonl" for p in run_dir.glob("*")), sorted(run_dir.glob("*"))


def test_rejected_records_under_strict_are_a_data_error(tmp_path):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"id": "s-1", "theme": "friendship"}\nnot json\n')
    run_dir = tmp_path / "run"
    result = run_py(run_dir, f"seeds_path={seeds}", "strict=true")
    assert result.returncode == EXIT_CODES["data"], result.stderr[-2000:]
    assert "strict=true" in error_line(result)
    assert not (run_dir / "prompts.jsonl").exists()


def test_full_traceback_on_request(tmp_path):
    result = run_py(
        tmp_path / "run",
        "constraints.min_sentences=9",
        "constraints.max_sentences=3",
        env={"HYDRA_FULL_ERROR": "1"},
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr
