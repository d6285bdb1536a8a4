"""Reading one JSON document from a user's file or a server's answer, as Unicode text only.

Takes: the text or bytes of one JSON document (a JSONL line, an HTTP body). Gives:
:func:`loads`, which is :func:`json.loads` except that a string holding an unpaired surrogate
(written as an escape such as ``"\\ud800"``, which JSON allows, or present in text decoded
leniently) is refused with a :class:`json.JSONDecodeError` naming the code point and its
column, and so is a document nested deeper than :func:`json.loads` can follow (it raises
``RecursionError``, which no reader would take for a bad line).

Why: such a string is not Unicode text. It cannot be written as UTF-8, so the first file it
reached (``rejected_seeds.jsonl``, ``validated.jsonl``, a Parquet twin) would fail the whole run
with ``UnicodeEncodeError``. Refused where it is read, the record is reported by line number
like any other malformed line, and the run goes on. Every reader of outside data goes
through here; files storyforge wrote itself never hold such strings.

How: for bytes the check costs one substring test per document, for text one scan more; only
a document that holds a surrogate escape (or a surrogate) is walked.

JSONL files: :func:`read_jsonl` gives ``(line number, value)`` for each non-blank line of a
file, and :func:`parse_line` decodes one line. A line that is not UTF-8 text or not JSON gives
a :class:`BadLine` instead of a value (the lines after it are still read), and its message is
worded the same for every file: ``not JSON: <reason> (column N)`` or ``not UTF-8 text: byte N
cannot be decoded``; :meth:`BadLine.at` puts the file and line in front (``PATH:LINE: ...``).
A byte-order mark at the start of a file is ignored.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BadLine", "blank", "loads", "parse_line", "read_jsonl"]

# \uD800 to \uDFFF as JSON escapes (either case); an escaped backslash before the "u" is a
# false alarm that the walk over the decoded value then clears.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# A surrogate itself, in text that was decoded leniently (str input only).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return value


class _DuplicateKey(ValueError):
    pass


def loads(raw: str | bytes, *, unique_keys: bool = False) -> Any:
    """``json.loads(raw)``, refusing strings that are not Unicode text, documents nested
    deeper than the reader can follow, and numbers too long to read (see the module).

    With ``unique_keys`` an object that names a key twice is refused too (``json.loads``
    would keep the last one silently); it costs a Python call per object, so it is for
    records a user wrote (seed and completion lines), not for a server's answers.
    """
    try:
        value = json.loads(raw, object_pairs_hook=_unique) if unique_keys else json.loads(raw)
    except RecursionError:
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise json.JSONDecodeError("arrays or objects nested too deeply to read", text, 0) from None
    except _DuplicateKey as exc:
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        key = json.dumps(exc.args[0], ensure_ascii=False)
        at = text.find(key)
        raise json.JSONDecodeError(
            f"duplicate key {key} (a record names each key once)", text, max(at, 0)
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError):  # bytes that are not UTF-8 say so
        raise
    except ValueError as exc:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise json.JSONDecodeError(f"a number too long to read ({exc})", text, 0) from None
    if isinstance(raw, bytes):  # UTF-8 bytes cannot hold a surrogate itself, only its escape
        if b"\\u" not in raw:
            return value
        text = raw.decode("utf-8", "replace")
        if _SURROGATE_ESCAPE.search(text) is None:
            return value
    else:
        text = raw
        if ("\\u" not in raw or _SURROGATE_ESCAPE.search(raw) is None) and _SURROGATE.search(raw) is None:
            return value
    bad = _first_unpaired(value)
    if bad is not None:
        escape = f"\\u{ord(bad):04x}"
        found = re.search(f"{re.escape(escape)}|{re.escape(bad)}", text, re.IGNORECASE)
        raise json.JSONDecodeError(
            f"unpaired surrogate {escape} in a string (not Unicode text)", text, found.start() if found else 0
        )
    return value


def _first_unpaired(value: Any) -> str | None:
    """The first lone surrogate in any string (key or value) of ``value``, else ``None``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return item[exc.start]
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                stack.append(inner)
                stack.append(key)
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return None


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of a JSONL file that holds no JSON value: its number and why, in one wording."""

    line: int
    message: str
    """``not JSON: <reason> (column N)`` or ``not UTF-8 text: byte N cannot be decoded``."""

    @classmethod
    def of(cls, exc: ValueError, line: int) -> BadLine:
        """The bad line that ``exc`` (from decoding or parsing line ``line``) describes."""
        if isinstance(exc, UnicodeDecodeError):
            return cls(line, f"not UTF-8 text: byte {exc.start + 1} cannot be decoded")
        if isinstance(exc, json.JSONDecodeError):
            return cls(line, f"not JSON: {exc.msg} (column {exc.colno})")
        return cls(line, f"not JSON: {exc}")

    def at(self, path: str | os.PathLike[str]) -> str:
        """``PATH:LINE: <message>``, the line that names this problem on its own."""
        return f"{os.fspath(path)}:{self.line}: {self.message}"


def blank(raw: bytes, line: int) -> bool:
    """Whether line ``line`` of a file holds only whitespace (and line 1 a byte-order mark)."""
    return not (raw.removeprefix(codecs.BOM_UTF8) if line == 1 else raw).strip()


def parse_line(raw: bytes, line: int, *, unique_keys: bool = False) -> Any:
    """The value on line ``line`` of a file (its bytes ``raw``, not blank), or a :class:`BadLine`.
    Line 1 may start with a byte-order mark."""
    if line == 1:
        raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        if b"\xed" in raw:  # the lead byte of an encoded surrogate, which json.loads lets through
            raw.decode("utf-8")
        return loads(raw, unique_keys=unique_keys)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if isinstance(exc, json.JSONDecodeError) and raw.endswith(b"\n"):
            # without its newline, so that an error at the end has a column on this line
            return parse_line(raw[:-1], line, unique_keys=unique_keys)
        return BadLine.of(exc, line)


def read_jsonl(path: str | os.PathLike[str], *, unique_keys: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line number, value or BadLine)`` for each non-blank line of ``path``, streamed.

    Lines are split on newlines only (not on the other breaks ``str.splitlines`` knows), so
    the numbers are the ones an editor or ``sed -n`` shows.
    """
    with Path(path).open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not blank(raw, number):
                yield number, parse_line(raw, number, unique_keys=unique_keys)
