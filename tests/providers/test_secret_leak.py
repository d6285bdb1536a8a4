"""The API key never written: a distinctive key, every hostile server behaviour, every file searched.

Each case runs ``python run.py`` against a loopback server that misbehaves on purpose with the
key (it echoes it raw, cut at the error-text limit, URL-encoded, base64-encoded, inside a normal
answer, in a redirect, in a malformed answer, from another model), with a response cache and a
``base_url`` carrying user info. Then every file the run wrote (the run directory with its
``.hydra`` snapshot and log, and the cache), stdout and stderr are searched for the key and
the password in every encoding, and for any 12-character run of them. Under ``executor=ray``
the files of the local Ray instance the run starts (its session directory: the workers'
``worker-*.out``/``.err``, the raylet's and the core workers' logs) are searched as well.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from test_provider_hostile import Hostile, Reply, completion, error, run_py

KEY = "sk-LeAk/9f2+c7e1b4a8d3f6e0c9b2a5d8f1e4c7=b0Zq"
PASSWORD = "pw-Secr3t-Hunter2x"
CUT = 500  # the error-text limit: the key is placed across it


def _padded(text: str, at: int) -> str:
    """``text`` placed so that it starts ``at`` characters into the message."""
    return "x" * at + " " + text


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


Behaviour = Callable[[str], Callable[[int, dict[str, Any]], Reply]]


def _other_model(secret: str) -> Callable[[int, dict[str, Any]], Reply]:
    payload = {
        "model": f"other-{secret}",
        "choices": [
            {"message": {"role": "assistant", "content": f"{secret} Mia ran."}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }
    return lambda n, body: (200, {"Content-Type": "application/json"}, json.dumps(payload).encode())


#: What the server does with the secret it was sent (the key, or the password of the URL).
BEHAVIOURS: dict[str, Behaviour] = {
    "401-raw": lambda s: lambda n, body: error(401, f"invalid key {s}"),
    "401-across-the-cut": lambda s: lambda n, body: error(401, _padded(s, CUT - 1 - len(s) // 2)),
    "400-url-encoded": lambda s: (
        lambda n, body: error(400, f"bad token {quote(s, safe='')} / {quote_plus(s)}")
    ),
    "400-base64": lambda s: (
        lambda n, body: error(400, f"Authorization: Basic {_b64('u:' + s)} Bearer {_b64(s)}")
    ),
    "400-raw-text": lambda s: (
        lambda n, body: (400, {"Content-Type": "text/plain"}, f"{s}\n{s[:30]}".encode())
    ),
    "500-retried-then-given-up": lambda s: lambda n, body: error(500, f"upstream rejected {s[3:]}"),
    "200-echo-in-answer": lambda s: (
        lambda n, body: completion(body, f"Once upon a time the key {s} was read aloud.")
    ),
    "200-echo-hex-and-fragment": lambda s: (
        lambda n, body: completion(body, f"{binascii.hexlify(s.encode()).decode()} and {s[5:25]}")
    ),
    "200-malformed-with-key": lambda s: (
        lambda n, body: (
            200,
            {"Content-Type": "application/json"},
            f'{{"oops": "{s}"'.encode(),
        )
    ),
    "307-redirect-with-key": lambda s: (
        lambda n, body: (
            307,
            {"Location": f"http://127.0.0.1:9/steal?k={quote(s)}"},
            b"",
        )
    ),
    "200-other-model-echo": _other_model,
}


def _needles() -> dict[str, str]:
    """Every spelling of the key and the password searched for, and every 12-character run of them."""
    needles: dict[str, str] = {}
    for name, secret in (("key", KEY), ("password", PASSWORD)):
        spellings = {
            "raw": secret,
            "quote": quote(secret, safe=""),
            "quote_plus": quote_plus(secret),
            "hex": binascii.hexlify(secret.encode()).decode(),
            "json": json.dumps(secret)[1:-1],
        }
        for shift in range(3):  # base64 of the secret at each alignment inside a longer text
            encoded = base64.b64encode(b"\0" * shift + secret.encode()).decode()
            spellings[f"b64@{shift}"] = encoded[4 if shift else 0 : -4]
            spellings[f"b64url@{shift}"] = base64.urlsafe_b64encode(b"\0" * shift + secret.encode()).decode()[
                4 if shift else 0 : -4
            ]
        for form, text in spellings.items():
            for start in range(len(text) - 12 + 1):
                needles[f"{name}/{form}[{start}:{start + 12}]"] = text[start : start + 12]
    return needles


NEEDLES = _needles()


def _leaks(text: str) -> list[str]:
    return sorted({label for label, needle in NEEDLES.items() if needle in text})


def _run(
    tmp_path: Path,
    behaviour: str,
    auth: str,
    *more: str,
    n_seeds: int = 3,
    env: dict[str, str] | None = None,
    searched: Callable[[], list[Path]] = list,
) -> tuple[Any, list[Path]]:
    """Run against ``behaviour``, then search every file of the run and ``searched()`` for a leak."""
    run_dir = tmp_path / "run"
    cache = tmp_path / "cache" / "responses.sqlite"
    secret = KEY if auth == "key" else PASSWORD
    with Hostile(BEHAVIOURS[behaviour](secret)) as server:
        url = server.base_url
        if auth != "key":
            url = url.replace("http://", f"http://storyuser:{PASSWORD}@")
        overrides = ["provider.api_key_env=SF_LEAK_KEY"] if auth != "userinfo" else []
        result = run_py(
            run_dir,
            "provider=openai",
            "provider.model=tiny",
            f"provider.base_url={url}",
            *overrides,
            "provider.max_retries=1",
            "provider.on_model_mismatch=warn",
            "provider.max_error_rate=1",
            f"cache.path={cache}",
            f"task.n_seeds={n_seeds}",
            *more,
            env={"SF_LEAK_KEY": KEY, **(env or {})},
        )
    if auth != "both":
        assert server.requests >= 1, result.stderr[-3000:]
    written = [p for p in [*run_dir.rglob("*"), *cache.parent.rglob("*")] if p.is_file()]
    assert any(p.name.endswith(".log") for p in written), [p.name for p in written]
    found = {
        str(path): leaks
        for path in [*written, *searched()]
        if (leaks := _leaks(path.read_bytes().decode("utf-8", "replace")))
    }
    found.update(
        {
            stream: leaks
            for stream, text in (("stdout", result.stdout), ("stderr", result.stderr))
            if (leaks := _leaks(text))
        }
    )
    assert found == {}, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result, written


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_the_key_is_in_no_file_log_or_stream(tmp_path: Path, behaviour: str) -> None:
    """Whatever the server does with the key, no file of the run, nor stdout/stderr, holds any form of it."""
    result, written = _run(tmp_path, behaviour, "key")
    # The run said what happened, with the key masked rather than dropped silently.
    if behaviour not in ("307-redirect-with-key",):
        assert "***" in result.stderr + "".join(p.read_text("utf-8", "replace") for p in written), behaviour


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["401-raw", "400-base64", "200-echo-in-answer"])
def test_url_credentials_are_in_no_file_log_or_stream(tmp_path: Path, behaviour: str) -> None:
    """A base_url with user:password@ is sent as Basic auth; neither the password nor the header leaks."""
    _run(tmp_path, behaviour, "userinfo")


@pytest.mark.slow
def test_url_credentials_and_a_key_are_one_config_error(tmp_path: Path) -> None:
    """Both a password in base_url and an API key: one line naming the conflict, nothing leaked."""
    result, _ = _run(tmp_path, "401-raw", "both")
    assert result.returncode == 2
    assert "give only one of them" in result.stderr.splitlines()[-1]


@contextmanager
def _ray_temp_dir() -> Iterator[Path]:
    """A short private ``RAY_TMPDIR`` (Ray's socket paths must stay under 108 bytes), removed
    once every process of the Ray instance started in it has ended."""
    root = Path(tempfile.mkdtemp(prefix="sf-leak-", dir="/tmp"))
    try:
        yield root
    finally:
        _wait_for_ray_processes(root)
        shutil.rmtree(root, ignore_errors=True)


def _ray_processes(root: Path) -> list[int]:
    """The ids of the live processes of the Ray instance whose files are under ``root`` (Linux /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(root).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # ended meanwhile
            continue
    return found


def _wait_for_ray_processes(root: Path) -> None:
    """Wait for the Ray instance under ``root`` to end (its logs are then complete); a process
    still there after 60 s is ended (it was started by this test's run)."""
    deadline = time.monotonic() + 60
    while (pids := _ray_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize(
    ("behaviour", "auth"),
    # One run per path a secret can take through a worker (each Ray run costs ~15 s): error
    # text across the cut, an answer echoing it in several encodings, a retried failure, the
    # served model's name (logged by the worker), and URL credentials; the local test above
    # covers every behaviour.
    [
        ("401-across-the-cut", "key"),
        ("200-echo-hex-and-fragment", "key"),
        ("500-retried-then-given-up", "key"),
        ("200-other-model-echo", "key"),
        ("200-echo-in-answer", "userinfo"),
    ],
)
def test_the_key_is_in_no_ray_worker_log(tmp_path: Path, behaviour: str, auth: str) -> None:
    """executor=ray with two shards: the workers read the key from the environment (or the
    password from base_url) and send it; whatever the server does with it, no file of the run, no
    file of the Ray session (the workers' ``.out``/``.err``, the raylet's and the core workers'
    logs), nor stdout/stderr holds any form of it."""
    worker_errors: list[str] = []
    with _ray_temp_dir() as ray_tmp:

        def session_files() -> list[Path]:
            _wait_for_ray_processes(ray_tmp)
            files = [p for p in ray_tmp.rglob("*") if p.is_file() and not p.is_symlink()]
            logs = {p.name for p in files if p.parent.name == "logs"}
            # The instance really ran here, with workers that did the shards.
            assert any(name.startswith("raylet") for name in logs), sorted(logs)
            assert any(name.startswith("worker-") and name.endswith(".err") for name in logs), sorted(logs)
            assert any(name.startswith("python-core-worker-") for name in logs), sorted(logs)
            worker_errors.extend(
                p.read_text("utf-8", "replace") for p in files if p.name.startswith("worker-")
            )
            return files

        result, written = _run(
            tmp_path,
            behaviour,
            auth,
            "executor=ray",
            "executor.shards=2",
            "executor.num_cpus=2",
            n_seeds=4,
            env={"RAY_TMPDIR": str(ray_tmp)},
            searched=session_files,
        )
    assert any("shards" in p.relative_to(tmp_path).parts for p in written), [str(p) for p in written]
    if behaviour not in ("307-redirect-with-key",):
        assert "***" in result.stderr + "".join(p.read_text("utf-8", "replace") for p in written), behaviour
    if behaviour == "200-other-model-echo":  # a worker's own warning names the served model, masked
        assert any("answers with model 'other-***'" in text for text in worker_errors), worker_errors
