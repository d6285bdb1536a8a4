"""Template ids as names: the one rule for an id that may become a file name or a URL part.

Takes: a template id (any string). Gives: :func:`normal_id` (the id in Unicode NFC, so ``é``
typed as one code point or as ``e`` plus a combining accent is one template), :func:`id_problem`
(why an id is refused, or ``None``) and :func:`file_stem` (a file name for any stored id, even
one written before the rule, that never leaves its folder), and :func:`content_hash` (a
template's identity by content: the hash the store keeps and each exported row's provenance
names).

Why: a stored id becomes a file name (``storyforge templates export --all FOLDER``), a URL path
part (the studio) and a primary key (SQLite and PostgreSQL). An id such as ``../conf/config``,
``/abs/x`` or one holding a NUL would write outside the folder, never open in the studio, or be
kept by one database and refused by the other. The store, the command and the studio all go
through :func:`id_problem`, so the rule is the same everywhere.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any
from urllib.parse import quote

__all__ = ["compact_json", "content_hash", "file_stem", "id_problem", "normal_id", "sorted_hash"]

#: Characters an id may not hold: path separators and the drive/stream separator of Windows.
_SEPARATORS = frozenset("/\\:")


def normal_id(value: str) -> str:
    """``value`` in Unicode NFC (the form the store keeps and looks up)."""
    return unicodedata.normalize("NFC", value)


def _control(char: str) -> bool:
    # Cc: C0/C1 controls (NUL, newline, ESC, U+0085); Zl/Zp: line and paragraph separators;
    # Cs: lone surrogates (no file system or database takes them).
    return unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a template id, or ``None`` when it can.

    Refused: the empty id, ``.`` and ``..``, an id with a path separator (``/``, ``\\``,
    ``:``), a control character (NUL, newline, ...), a line separator or a lone surrogate,
    and an id with spaces at either end.
    """
    if not value:
        return "the id is empty"
    if value in (".", ".."):
        return f"the id {value!r} names a folder, not a template"
    for char in value:
        if char in _SEPARATORS:
            return f"the id {value!r} holds {char!r}; ids become file names, so they hold no path separator"
        if _control(char):
            return (
                f"the id {value!r} holds the control character U+{ord(char):04X}; "
                "ids become file names, so they hold none"
            )
    if value != value.strip():
        return f"the id {value!r} starts or ends with a space"
    return None


def file_stem(value: str) -> str:
    """A file name (without suffix) for a stored id; safe even for an id the rule refuses.

    A safe id is its own stem. Any other (kept in a store before the rule, or written behind
    the store's back) is percent-encoded, so it never names a folder or leaves one.
    """
    normal = normal_id(value)
    if id_problem(normal) is None:
        return normal
    stem = quote(normal, safe="", errors="surrogatepass")
    return stem if stem not in ("", ".", "..") else f"%{stem or 'empty'}"


def compact_json(data: Any) -> str:
    """``data`` as compact JSON in its own key order (no NaN)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def content_hash(data: Any) -> str:
    """SHA-256 of the compact JSON of ``data`` in its own key order.

    Key order is part of a template's meaning (slots of equal priority run in declared
    order), so it is part of the hash.
    """
    return hashlib.sha256(compact_json(data).encode("utf-8")).hexdigest()


def sorted_hash(data: Any) -> str:
    """SHA-256 of the compact JSON of ``data`` with its keys sorted (for data whose key order
    means nothing: settings, a prompt format)."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
