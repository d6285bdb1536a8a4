"""Redaction: every form of a secret, and every long enough run of one, out of any text; URLs built by parts."""

from __future__ import annotations

import base64
import logging
import re
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge.providers.base import join_url, split_userinfo
from storyforge.redaction import MASK, Redactor, fragment_length, strip_userinfo

KEY = "sk-proj-Zr8/Qw+3nB7xLm2=Kd9fT4vHc6Ys1Ua0"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"invalid key {KEY}.", id="raw"),
        pytest.param(f"key {KEY[:-2]}…", id="cut-at-the-end"),
        pytest.param(f"…{KEY[7:]} was refused", id="cut-at-the-start"),
        pytest.param(f"token={quote(KEY, safe='')}", id="url-encoded"),
        pytest.param(
            "token=" + re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(KEY, safe="")),
            id="url-encoded-lower-hex",
        ),
        pytest.param(f"q={quote_plus(KEY)}", id="quote-plus"),
        pytest.param(f"Basic {_b64('user:' + KEY)}", id="base64-after-a-prefix"),
        pytest.param(f"Bearer {_b64(KEY)}", id="base64-alone"),
        pytest.param(f"x {_b64('ab' + KEY + 'tail')}", id="base64-shifted"),
        pytest.param(KEY.encode().hex(), id="hex"),
        pytest.param(f"half {KEY[10:30]} of it", id="a-fragment"),
    ],
)
def test_every_form_of_the_key_is_masked(text: str) -> None:
    """The key in any spelling, whole or a run of at least fragment_length characters, becomes ***."""
    out = Redactor([KEY])(text)
    assert MASK in out
    flat = out.replace(MASK, "\0")
    for start in range(len(KEY) - fragment_length(KEY) + 1):
        assert KEY[start : start + fragment_length(KEY)] not in flat


def test_text_without_the_key_is_unchanged() -> None:
    """Ordinary text, even sharing short pieces with the key, is left alone."""
    text = "sk- proj Zr8 and a story about Mia, who found a red kite."
    assert Redactor([KEY])(text) == text


def test_a_short_secret_is_masked_only_whole() -> None:
    """A secret shorter than 8 characters is masked where it stands whole, not by its parts."""
    assert Redactor(["hunter"])("hunter2 and hunt") == "***2 and hunt"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60), st.integers(0, len(KEY) - 16), st.integers(16, len(KEY)))
def test_any_long_enough_run_in_any_text_is_masked(before: str, after: str, start: int, length: int) -> None:
    """Wherever a run of >= 16 characters of the key stands, no run of fragment_length of it survives."""
    piece = KEY[start : start + length]
    out = Redactor([KEY])(before + piece + after)
    n = fragment_length(KEY)
    for i in range(len(KEY) - n + 1):
        assert KEY[i : i + n] not in out.replace(MASK, "\0") or KEY[i : i + n] in before + after


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://bob:pw@host:8/v1 failed", "http://***@host:8/v1 failed"),
        ("see https://token@api.example/x", "see https://***@api.example/x"),
        ("mail bob@example.com", "mail bob@example.com"),
        ("http://host/v1?x=a@b", "http://host/v1?x=a@b"),
    ],
)
def test_user_info_is_stripped_from_urls_in_text(text: str, expected: str) -> None:
    assert strip_userinfo(text) == expected


@pytest.mark.parametrize(
    ("base", "path", "expected"),
    [
        ("http://h:1/v1", "chat/completions", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/", "chat/completions", "http://h:1/v1/chat/completions"),
        (
            "http://h/v1?api-version=2024-02",
            "chat/completions",
            "http://h/v1/chat/completions?api-version=2024-02",
        ),
        ("http://h", "api/chat", "http://h/api/chat"),
        ("http://[::1]:8/x?a=1&b=2", "/y", "http://[::1]:8/x/y?a=1&b=2"),
    ],
)
def test_join_url_appends_the_path_outside_the_query(base: str, path: str, expected: str) -> None:
    """A base_url with a query string keeps it after the appended path."""
    assert join_url(base, path) == expected


def test_user_info_becomes_a_basic_header_and_leaves_the_url() -> None:
    url, header = split_userinfo("http://bob:p%40ss@127.0.0.1:9/v1/chat/completions?k=1")
    assert url == "http://127.0.0.1:9/v1/chat/completions?k=1"
    assert header == "Basic " + _b64("bob:p@ss")


def test_log_records_are_redacted_with_their_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """Once registered, a secret is masked in every log message and traceback of the process."""
    from storyforge import redaction

    secret = "sk-logtest-0f1e2d3c4b5a69788796a5b4"
    redaction.register(secret)
    log = logging.getLogger("storyforge.test_redaction")
    with caplog.at_level(logging.INFO):
        log.info("sent %s", secret)
        try:
            raise ValueError(f"server said {secret}")
        except ValueError:
            log.exception("failed")
    text = caplog.text
    assert secret[:20] not in text and secret[-20:] not in text
    assert text.count(MASK) >= 2  # the message and the exception's line


@pytest.mark.parametrize(
    ("secret", "text"),
    [
        ("user", "2 job(s) without a result: job 0"),
        ("pw", "the answer wp was kept"),
        ("tok", "kot is a word"),
    ],
)
def test_a_short_secret_backwards_is_not_found_inside_words(secret: str, text: str) -> None:
    """A short secret (a URL's user name) is redacted as it is written, never its reversal: a
    reversed short string is found inside ordinary words."""
    assert Redactor([secret])(text) == text
