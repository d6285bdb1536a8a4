"""Secrets out of every text storyforge shows or keeps: API keys and URL credentials, in any form.

Takes: the secrets of a run (:func:`register`: an API key read from the environment, the
password in a URL's user info). Gives: :func:`redact` (any text with every known secret, and
every form of it, replaced by ``***``), :func:`strip_userinfo` (URLs in a text without their
``user:pass@``) and :class:`Redactor` (the same for an explicit set of secrets).

Forms: the secret as it is, URL-encoded (``quote``, ``quote_plus``, both hex cases), hex, JSON-
escaped, base64 (standard and URL-safe alphabets, at each of the three byte alignments a
secret can have inside a longer encoded text, as in a ``Basic`` header), base32 (at each of
its five alignments) and reversed. Each form is also searched in a normalised view of the
text: HTML character references decoded (``&#115;``, ``&#x73;``, ``&amp;``...), whitespace
and the separators ``- _ . : , ; |`` removed (a key split into lines or groups), and
lower-cased (a key in upper case); a match in the view masks the text it came from. Any run
of at least :func:`fragment_length` characters of any form is redacted too, so a key cut by a
server, a log line or a truncation is caught by what is left of it; and at either end of a
text, a piece of at least :data:`EDGE_FRAGMENT` characters that begins a form (at the end) or
ends one (at the start), which is what a cut leaves of a key.

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
import bisect
import html
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

__all__ = [
    "EDGE_FRAGMENT",
    "MASK",
    "Redactor",
    "forms",
    "fragment_length",
    "redact",
    "redact_every_log_record",
    "register",
    "register_url",
    "registered",
    "strip_userinfo",
]

MASK = "***"
#: Secrets shorter than this are redacted only whole (a short password is often a common word part).
_MIN_FRAGMENT = 8
#: ``scheme://user:pass@``, also as Hydra escapes it in an override it prints (``http\://u\:p@``).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*\\?://)(?P<userinfo>[^/?#@\s\"'<>]*)@")


def fragment_length(secret: str) -> int:
    """Shortest run of ``secret`` (or of one of its forms) that is redacted on its own."""
    if len(secret) < _MIN_FRAGMENT:
        return len(secret)
    return max(_MIN_FRAGMENT, min(16, len(secret) // 2))


def _cores(raw: bytes, block: int, width: int, *encoders: Callable[[bytes], bytes]) -> list[str]:
    """The encoded text of ``raw`` wherever it stands in a longer byte string, per alignment: an
    encoding that turns ``block`` bytes into ``width`` characters (base64: 3 and 4, base32: 5 and 8)."""
    cores: list[str] = []
    for shift in range(block):
        data = b"\0" * shift + raw
        for encode in encoders:
            text = encode(data).decode("ascii")
            start = width if shift else 0  # the first group mixes in the bytes before the secret
            end = len(text) - (width if len(data) % block else 0)  # the last group mixes in the bytes after
            if end - start >= width:
                cores.append(text[start:end])
    return cores


def forms(secret: str) -> list[str]:
    """Every spelling of ``secret`` searched for (longest first, no duplicates)."""
    raw = secret.encode("utf-8", "surrogatepass")
    found = {
        secret,
        # reversed only when long enough to tell from a word ("user" backwards is in "result")
        secret[::-1] if len(secret) >= _MIN_FRAGMENT else secret,
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        binascii.hexlify(raw).decode("ascii"),
        *_cores(raw, 3, 4, base64.b64encode, base64.urlsafe_b64encode),
        *_cores(raw, 5, 8, base64.b32encode),
    }
    lower_hex = {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), form) for form in found}
    found |= lower_hex
    return sorted((form for form in found if form), key=lambda form: (-len(form), form))


#: The shortest piece of a form masked at an end of a text (what a cut leaves of a key).
EDGE_FRAGMENT = 6
#: What the normalised view of a text leaves out: whitespace and the separators a key is split by.
_SEPARATORS = re.compile(r"[\s\-_.:,;|\u200b-\u200d\u2060\ufeff]+")
_KEPT = re.compile(r"[^\s\-_.:,;|\u200b-\u200d\u2060\ufeff]+")
#: An HTML character reference (decoded in the view when html.unescape knows it).
_REFERENCE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
#: What may stand after a cut piece at the end of a text, or before one at the start.
_CUT_MARKS = "\u2026\"'`)]}>([{<"

Plan = tuple[str, int, int]
"""(form, fragment length, block size)."""


def _lower(text: str) -> str:
    """``text`` lower-cased character by character (the same length, so positions still match)."""
    low = text.lower()
    if len(low) == len(text):
        return low
    return "".join(low_c if len(low_c := c.lower()) == 1 else c for c in text)


def _normal(form: str) -> str:
    return _lower(_SEPARATORS.sub("", form))


def _decoded(text: str) -> tuple[str, list[tuple[int, int, int, int]]]:
    """``text`` with its HTML character references decoded, and each one's (start, end) in
    ``text`` and (start, end) in the result."""
    if "&" not in text:
        return text, []
    parts: list[str] = []
    references: list[tuple[int, int, int, int]] = []
    last = at = 0
    for match in _REFERENCE.finditer(text):
        value = html.unescape(match.group(0))
        if value == match.group(0):
            continue  # not a reference html knows: left as it is
        parts.append(text[last : match.start()])
        at += match.start() - last
        parts.append(value)
        references.append((match.start(), match.end(), at, at + len(value)))
        at += len(value)
        last = match.end()
    parts.append(text[last:])
    return "".join(parts), references


def _view(text: str) -> str:
    """The normalised view of ``text`` searched for the normalised forms (see the module)."""
    return _lower(_SEPARATORS.sub("", _decoded(text)[0]))


def _view_map(text: str) -> Callable[[int, int], tuple[int, int]]:
    """Where the view's ``[start, end)`` stands in ``text`` (built only once a view holds a match)."""
    decoded, references = _decoded(text)
    runs = [(m.start(), m.end()) for m in _KEPT.finditer(decoded)]
    run_view_starts: list[int] = []
    at = 0
    for start, end in runs:
        run_view_starts.append(at)
        at += end - start
    reference_starts = [r[2] for r in references]

    def in_text(index: int) -> tuple[int, int]:
        """The span of ``text`` that the decoded text's character ``index`` came from."""
        i = bisect.bisect_right(reference_starts, index) - 1
        if i >= 0 and index < references[i][3]:
            return references[i][0], references[i][1]
        shift = references[i][1] - references[i][3] if i >= 0 else 0
        return index + shift, index + shift + 1

    def span(start: int, end: int) -> tuple[int, int]:
        def decoded_index(index: int) -> int:
            run = bisect.bisect_right(run_view_starts, index) - 1
            return runs[run][0] + index - run_view_starts[run]

        return in_text(decoded_index(start))[0], in_text(decoded_index(end - 1))[1]

    return span


def _plans_of(secret_forms: Iterable[str], least: int) -> list[Plan]:
    plans: list[Plan] = []
    for form in secret_forms:
        if form:
            length = min(len(form), max(least, fragment_length(form)))
            plans.append((form, length, max(1, length // 2)))
    return plans


def _find(text: str, plans: list[Plan], found: list[tuple[int, int]]) -> None:
    """Add to ``found`` every span of ``text`` holding a form of ``plans`` or a long enough run of one."""
    for form, length, block in plans:
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
                while left < offset and at - left - 1 >= 0 and text[at - left - 1] == form[offset - left - 1]:
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


def _edges(text: str, plans: list[Plan], found: list[tuple[int, int]]) -> None:
    """Add the piece at either end of ``text`` (cut marks such as ``…`` aside) that begins (at
    the end) or ends (at the start) a form: its last (first) :data:`EDGE_FRAGMENT` characters
    are looked up in the form, then the piece is grown along it."""
    last = len(text.rstrip(_CUT_MARKS))
    first = len(text) - len(text.lstrip(_CUT_MARKS))
    if last - first < EDGE_FRAGMENT:
        return
    tail, head = text[last - EDGE_FRAGMENT : last], text[first : first + EDGE_FRAGMENT]
    for form, length, _ in plans:
        if length == len(form) or len(form) <= EDGE_FRAGMENT:
            continue  # a form redacted only whole, or too short to tell by a piece
        at = form.find(tail)  # the piece is form[:size]: its tail ends at size
        while at >= 0:
            size = at + EDGE_FRAGMENT
            if size < len(form) and last - size >= first and text.startswith(form[:size], last - size):
                found.append((last - size, last))
                break
            at = form.find(tail, at + 1)
        at = form.find(head)  # the piece is form[-size:]: its head starts at len - size
        while at >= 0:
            size = len(form) - at
            if size < len(form) and first + size <= last and text.startswith(form[at:], first):
                found.append((first, first + size))
                break
            at = form.find(head, at + 1)


class Redactor:
    """Replaces every form of the given secrets, and every long enough run of one, by ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._plans: list[Plan] = []
        self._view_plans: list[Plan] = []
        for secret in {s for s in secrets if s}:
            least = fragment_length(secret)
            spellings = forms(secret)
            if len(secret) < _MIN_FRAGMENT:  # a short secret is only ever redacted whole, as it is
                self._plans += _plans_of(spellings, least)
            else:
                # A form without separators is found in the view wherever it stands in the
                # text; one with them is also looked for as it is, for its fragments' sake.
                self._plans += _plans_of([f for f in spellings if _SEPARATORS.search(f)], least)
                self._view_plans += _plans_of(
                    sorted({_normal(f) for f in spellings}, key=lambda f: (-len(f), f)), least
                )

    def __bool__(self) -> bool:
        return bool(self._plans)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The ``(start, end)`` ranges of ``text`` that hold a secret, merged and sorted."""
        found: list[tuple[int, int]] = []
        _find(text, self._plans, found)
        if self._view_plans:
            view = _view(text)
            in_view: list[tuple[int, int]] = []
            _find(view, self._view_plans, in_view)
            _edges(view, self._view_plans, in_view)
            if in_view:
                span = _view_map(text)
                found += (span(start, end) for start, end in in_view if end > start)
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


def redact_every_log_record() -> None:
    """Redact every log record of the process from now on (URL user info even before any
    secret is registered: Hydra logs a sweep's overrides before its first job starts)."""
    with _lock:
        _install_log_factory()


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
        urls = [value] if isinstance(value, str) else value if hasattr(value, "__iter__") else []
        for url in urls:  # a list, or an OmegaConf ListConfig of URLs
            register_url(str(url))
