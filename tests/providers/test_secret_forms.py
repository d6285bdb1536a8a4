"""A key the server echoes in a form a plain search misses (split into lines, upper-cased,
reversed, base32, HTML character references, cut short) is in no file, log or stream of the
run: the redaction's normalised view finds it (docs/running.md lists the forms)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_provider_hostile import Hostile, Reply, completion, error, run_py

KEY = "sk-LeAk/9f2+c7e1b4a8d3f6e0c9b2a5d8f1e4c7=b0Zq"
RUN = 12  # no run of this many characters of the key (in any of the forms below) may survive


def _lines(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


FORMS: dict[str, str] = {
    "7-character lines": _lines(KEY, 7),
    "upper case": KEY.upper(),
    "reversed": KEY[::-1],
    "base32": base64.b32encode(KEY.encode()).decode(),
    "base32 after a prefix, lower case": base64.b32encode(b"key=" + KEY.encode()).decode().lower(),
    "HTML decimal references": "".join(f"&#{ord(c)};" for c in KEY),
    "HTML hex references": "".join(f"&#x{ord(c):X};" for c in KEY),
    "upper-case hex": KEY.encode().hex().upper(),
    "dashed groups of 4": "-".join(KEY[i : i + 4] for i in range(0, len(KEY), 4)),
}


def _view(text: str) -> str:
    return re.sub(r"[\s\-_.:,;|]+", "", html.unescape(text)).lower()


def _runs(secret: str) -> set[str]:
    return {secret[i : i + RUN] for i in range(len(secret) - RUN + 1)}


NEEDLES = (
    _runs(_view(KEY))
    | _runs(_view(KEY[::-1]))
    | _runs(base64.b32encode(KEY.encode()).decode().lower().rstrip("="))
    | _runs(KEY.encode().hex())
)


def _leaks(text: str) -> list[str]:
    view = _view(text)
    return sorted(needle for needle in NEEDLES if needle in view)


def _search(tmp_path: Path, answer: Callable[[int, dict[str, Any]], Reply], *more: str) -> Any:
    run_dir = tmp_path / "run"
    with Hostile(answer) as server:
        result = run_py(
            run_dir,
            "provider=openai",
            "provider.model=tiny",
            f"provider.base_url={server.base_url}",
            "provider.api_key_env=SF_FORMS_KEY",
            "provider.max_retries=1",
            "provider.max_error_rate=1",
            f"cache.path={tmp_path / 'cache' / 'responses.sqlite'}",
            "task.n_seeds=2",
            *more,
            env={"SF_FORMS_KEY": KEY},
        )
        assert server.requests >= 1, result.stderr[-2000:]
    files = [p for p in [*run_dir.rglob("*"), *(tmp_path / "cache").rglob("*")] if p.is_file()]
    assert any(p.name == "generations.jsonl" for p in files)
    found = {
        str(path): leaks for path in files if (leaks := _leaks(path.read_bytes().decode("utf-8", "replace")))
    }
    found.update(
        {
            name: leaks
            for name, text in (("stdout", result.stdout), ("stderr", result.stderr))
            if (leaks := _leaks(text))
        }
    )
    assert found == {}, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return result, files


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_key_echoed_in_another_form_is_in_no_file_or_stream(tmp_path: Path, form: str) -> None:
    echoed = FORMS[form]
    _, files = _search(
        tmp_path, lambda n, body: completion(body, f"Once upon a time {echoed} was read aloud.")
    )
    text = "".join(p.read_text("utf-8", "replace") for p in files if p.suffix in (".jsonl", ".log"))
    assert "***" in text  # masked, not dropped


@pytest.mark.parametrize("kept", [8, 12, 15])
def test_a_key_the_server_cut_short_leaves_none_of_its_characters(tmp_path: Path, kept: int) -> None:
    """The server's own message stops inside the key (it cut its text at 500 characters)."""
    message = ("x" * (500 - kept - 1) + " " + KEY)[:500]
    result, _ = _search(tmp_path, lambda n, body: error(401, message))
    assert result.returncode == 4
    assert KEY[:kept] not in result.stderr and KEY[:6] not in result.stderr
    assert "***" in result.stderr
