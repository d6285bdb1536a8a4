"""Retrieved contexts -> numbered snippets, exactly as a research-QA prompt shows them.

Takes: a record's ``rag.contexts`` (strings, ``None`` entries, or chunk mappings with
``text`` and optional ``section`` / ``page``). Gives: :func:`prepare_contexts` (one frozen
:class:`Context` per snippet kept, with its number and its shown text),
:func:`normalize_contexts` (the shown strings, the seed's function name) and
:data:`CONTEXT_SEPARATOR`, the one string that joins snippets in every prompt mode.

Why: the model is asked to cite ``[#]`` "based on the order of the snippets", so numbers must
be 1..n by position in every mode and in every exported record. Rules:

- ``None`` and empty entries are dropped; every entry is trimmed.
- A list whose entries all start with ``[k]`` and whose ``k`` are exactly 1..n in order is
  kept as it is. Anything else (some numbered, numbers repeated, out of order, starting at 7)
  loses its leading ``[k]`` markers and is numbered by position: never ``[1] [1]``, never
  ``[7]`` first.
- A chunk mapping renders as ``[i] Section: S | Page P`` then a newline and its text; the
  section or page part is left out when absent, the header line when both are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storyforge.errors import DataError

__all__ = [
    "CONTEXT_SEPARATOR",
    "Context",
    "join_contexts",
    "normalize_contexts",
    "prepare_contexts",
]

CONTEXT_SEPARATOR = "\n"
"""Joins numbered snippets in every mode (the seed's format: one snippet per line).

The packaged prompt format (``conf/prompt_format/research_qa.yaml``) states the same value as
``context_separator``; a test keeps the two equal.
"""

_MARKER = re.compile(r"\[(\d{1,6})\]")
_MARKER_AND_SPACE = re.compile(r"\[\d{1,6}\][ \t]*")


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """One snippet as shown: ``number`` (1-based position), ``shown`` (the full text in the
    prompt, number included), ``body`` (without the number), ``index`` (position in the
    record's original list, ``None`` entries counted) and the chunk metadata, if any."""

    number: int
    shown: str
    body: str
    index: int
    section: str | None = None
    page: str | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    index: int
    text: str  # trimmed, number marker still on
    section: str | None
    page: str | None
    is_chunk: bool


def prepare_contexts(contexts: Sequence[Any] | None) -> tuple[Context, ...]:
    """Apply the numbering rules above; raises :class:`DataError` naming a bad entry."""
    entries = list(_entries(contexts))
    numbers = [_leading_number(e.text) for e in entries]
    keep_as_is = bool(entries) and numbers == list(range(1, len(entries) + 1))
    out: list[Context] = []
    for position, entry in enumerate(entries, start=1):
        body = _strip_marker(entry.text)
        if entry.is_chunk:
            header = _header(entry.section, entry.page)
            body = f"{header}\n{body}" if header else body
        shown = entry.text if keep_as_is and not entry.is_chunk else f"[{position}] {body}"
        out.append(
            Context(
                number=position,
                shown=shown,
                body=body,
                index=entry.index,
                section=entry.section,
                page=entry.page,
            )
        )
    return tuple(out)


def normalize_contexts(contexts: Sequence[Any] | None) -> list[str]:
    """The snippets as shown in a prompt: ``["[1] …", "[2] …"]`` (see the module rules)."""
    return [c.shown for c in prepare_contexts(contexts)]


def join_contexts(contexts: Iterable[Context | str], separator: str = CONTEXT_SEPARATOR) -> str:
    """The context block: shown snippets joined by ``separator``."""
    return separator.join(c if isinstance(c, str) else c.shown for c in contexts)


def _entries(contexts: Sequence[Any] | None) -> Iterable[_Entry]:
    if contexts is None:
        return
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise DataError(
            f"contexts must be a list of strings or chunk mappings, got {type(contexts).__name__}"
        )
    for index, raw in enumerate(contexts):
        if raw is None:
            continue
        if isinstance(raw, str):
            text = raw.strip()
            if text and _strip_marker(text):
                yield _Entry(index, text, None, None, False)
            continue
        if isinstance(raw, Mapping):
            value = raw.get("text")
            if not isinstance(value, str):
                raise DataError(
                    f"contexts[{index}] is a chunk mapping without a 'text' string "
                    f"(keys: {', '.join(sorted(map(str, raw))) or 'none'})"
                )
            text = value.strip()
            if not text or not _strip_marker(text):
                continue
            yield _Entry(
                index,
                text,
                _meta(raw.get("section"), index, "section"),
                _meta(raw.get("page"), index, "page"),
                True,
            )
            continue
        raise DataError(
            f"contexts[{index}] must be a string, null or a mapping with 'text', got {type(raw).__name__}"
        )


def _meta(value: Any, index: int, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"contexts[{index}].{key} must be a string or a number, got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip() or None


def _header(section: str | None, page: str | None) -> str:
    parts = []
    if section:
        parts.append(f"Section: {section}")
    if page:
        parts.append(f"Page {page}")
    return " | ".join(parts)


def _leading_number(text: str) -> int | None:
    m = _MARKER.match(text)
    return int(m.group(1)) if m else None


def _strip_marker(text: str) -> str:
    m = _MARKER_AND_SPACE.match(text)
    return text[m.end() :].strip() if m else text
