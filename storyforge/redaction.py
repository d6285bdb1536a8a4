"""Secrets out of every text storyforge shows or keeps: API keys and URL credentials, in any form.

Takes: the secrets of a run (:func:`register`: an API key read from the environment, the
password in a URL's user info). Gives: :func:`redact` (any text with every known secret, and
every form of it, replaced by ``***``), :func:`strip_userinfo` (URLs in a text without their
``user:pass@``) and :class:`Redactor` (the same for an explicit set of secrets).

Forms: the secret as it is, URL-encoded (``quote``, ``quote_plus``, both hex cases), hex, JSON-
escaped, and base64 (standard and URL-safe alphabets, at each of the three byte alignments a
secret can have inside a longer encoded text, as in a ``Basic`` header). Any run of at least
:func:`fragment_length` characters of any form is redacted too, so a key cut by a server, a
log line or a truncation is caught by what is left of it.

Why one module: the key can reach a text through a server's error, an echo inside a normal
answer, an exception message or a log argument. Every sink (error strings, the journal, the
response cache, the log, stderr, the manifest, a Ray worker's log) calls :func:`redact` on its
text before it is cut or written, and :func:`register` also installs a log-record factory so
every log record of the process (with its traceback) is redacted before any handler sees it.

Search: a run of ``L`` characters of a form holds one of the form's aligned blocks of ``L // 2``
characters, so each block is found with ``str.find`` and the match is grown both ways along
the form; the cost is a handful of ``find`` calls per form, not one per character.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
from collections.abc import Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

__all__ = [
    "MASK",
    "Redactor",
    "forms",
    "fragment_length",
    "redact",
    "register",
    "register_url",
    "registered",
    "strip_userinfo",
]

MASK = "***"
#: Secrets shorter than this are redacted only whole (a short password is often a common word part).
_MIN_FRAGMENT = 8
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s\"'<>]*)@")


def fragment_length(secret: str) -> int:
    """Shortest run of ``secret`` (or of one of its forms) that is redacted on its own."""
    if len(secret) < _MIN_FRAGMENT:
        return len(secret)
    return max(_MIN_FRAGMENT, min(16, len(secret) // 2))


def _base64_cores(raw: bytes) -> list[str]:
    """The base64 text of ``raw`` wherever it stands in a longer byte string, per alignment."""
    cores: list[str] = []
    for shift in range(3):
        data = b"\0" * shift + raw
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(data).decode("ascii")
            start = 4 if shift else 0  # the first group mixes in the bytes before the secret
            end = len(text) - (4 if len(data) % 3 else 0)  # the last group mixes in the bytes after
            if end - start >= 4:
                cores.append(text[start:end])
    return cores


def forms(secret: str) -> list[str]:
    """Every spelling of ``secret`` searched for (longest first, no duplicates)."""
    raw = secret.encode("utf-8", "surrogatepass")
    found = {
        secret,
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        binascii.hexlify(raw).decode("ascii"),
        *_base64_cores(raw),
    }
    lower_hex = {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), form) for form in found}
    found |= lower_hex
    return sorted((form for form in found if form), key=lambda form: (-len(form), form))


class Redactor:
    """Replaces every form of the given secrets, and every long enough run of one, by ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._plans: list[tuple[str, int, int]] = []  # (form, fragment length, block size)
        for secret in {s for s in secrets if s}:
            least = fragment_length(secret)
            for form in forms(secret):
                length = min(len(form), max(least, fragment_length(form)))
                self._plans.append((form, length, max(1, length // 2)))

    def __bool__(self) -> bool:
        return bool(self._plans)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The ``(start, end)`` ranges of ``text`` that hold a secret, merged and sorted."""
        found: list[tuple[int, int]] = []
        for form, length, block in self._plans:
            if length == len(form):  # whole only
                at = text.find(form)
                while at >= 0:
                    found.append((at, at + len(form)))
                    at = text.find(form, at + 1)
                continue
            offsets = sorted({*range(0, len(form) - block + 1, block), len(form) - block})
            for offset in offsets:
                piece = form[offset : offset + block]
                at = text.find(piece)
                while at >= 0:
                    left = 0
                    while (
                        left < offset
                        and at - left - 1 >= 0
                        and text[at - left - 1] == form[offset - left - 1]
                    ):
                        left += 1
                    right = 0
                    tail = offset + block
                    end = at + block
                    while (
                        tail + right < len(form)
                        and end + right < len(text)
                        and text[end + right] == form[tail + right]
                    ):
                        right += 1
                    if left + block + right >= length:
                        found.append((at - left, end + right))
                    at = text.find(piece, at + 1)
        found.sort()
        merged: list[tuple[int, int]] = []
        for start, end in found:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def __call__(self, text: str) -> str:
        """``text`` with every secret's span replaced by ``***`` and URL user info removed."""
        if not self._plans:
            return strip_userinfo(text)
        spans = self.spans(text)
        if spans:
            parts: list[str] = []
            last = 0
            for start, end in spans:
                parts.append(text[last:start])
                parts.append(MASK)
                last = end
            parts.append(text[last:])
            text = "".join(parts)
        return strip_userinfo(text)


def strip_userinfo(text: str) -> str:
    """Every ``scheme://user:pass@`` in ``text`` as ``scheme://***@`` (nothing else changes)."""
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@" if m.group("userinfo") else m.group(0), text)


# -- the process's secrets ---------------------------------------------------------------------

_lock = threading.Lock()
_secrets: set[str] = set()


@lru_cache(maxsize=4)
def _redactor(secrets: frozenset[str]) -> Redactor:
    return Redactor(secrets)


def registered() -> frozenset[str]:
    """The secrets registered in this process (for tests)."""
    return frozenset(_secrets)


def register(secret: str | None) -> None:
    """Redact ``secret`` from now on in this process (:func:`redact` and every log record)."""
    if not secret:
        return
    with _lock:
        _secrets.add(secret)
        _install_log_factory()


def register_url(url: str) -> None:
    """Register the user name and password of ``url`` (when it has them) as secrets."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    for value in (password, user if password else None):
        if value and len(value) >= 4:
            register(value)


def redact(text: str) -> str:
    """``text`` with every registered secret (every form, every long enough run) replaced."""
    if not isinstance(text, str):
        text = str(text)
    if not _secrets:
        return strip_userinfo(text)
    return _redactor(frozenset(_secrets))(text)


def redact_value(value: Any) -> Any:
    """``value`` (JSON-like data) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


_factory_installed = False


def _install_log_factory() -> None:
    """Wrap the log-record factory once: each record's message and traceback are redacted."""
    global _factory_installed
    if _factory_installed:
        return
    _factory_installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):  # a bad format string is for logging to report
            return record
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)


def register_provider_secrets(provider: Any, environ: Any = None) -> None:
    """Register a run's secrets from its provider settings (any object with ``get``).

    The API key the ``api_key_env`` variable holds, and the user info of ``base_url``/``host``:
    the process that plans a run registers them as the processes that send requests do, so its
    own log, errors and files are redacted as theirs are.
    """
    import os

    if provider is None or not hasattr(provider, "get"):
        return
    env = os.environ if environ is None else environ
    name = provider.get("api_key_env", None)
    if isinstance(name, str) and name:
        register(env.get(name))
    for key in ("base_url", "host"):
        value = provider.get(key, None)
        urls = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
        if not isinstance(value, (str, list, tuple)) and value is not None and hasattr(value, "__iter__"):
            urls = [str(item) for item in value]
        for url in urls:
            if isinstance(url, str):
                register_url(url)
