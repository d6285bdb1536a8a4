"""The filters of the template language: ``{{ value | name(args) }}``.

Takes: the value an expression produced and the filter's evaluated arguments. Gives:
:data:`FILTERS` (name -> :class:`FilterSpec`: the function, how many arguments it takes and
one usage line for the docs), which the parser checks filter names and argument counts
against and the evaluator calls, and :data:`MAX_INDENT`.

Why: filters are the extension language's only transformations, and they follow the value
rules of :mod:`storyforge.engine.runtime` (text, truthiness, numbers). Each is total: a value it
cannot handle passes through unchanged or becomes ``None``, it never raises; whatever can
grow the output is checked against ``MAX_RENDER_CHARS`` first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from storyforge.engine.runtime import (
    JS_WHITESPACE,
    MAX_RENDER_CHARS,
    check_output_size,
    check_text_size,
    is_list,
    is_real_number,
    js_trim,
    json_string,
    length,
    to_json,
    to_text,
    truthy,
)

__all__ = ["FILTERS", "MAX_INDENT", "FilterSpec"]


def _as_items(value: Any) -> Sequence[Any]:
    if value is None:
        return ()
    if is_list(value):
        return value  # type: ignore[no-any-return]
    return (value,)


def _text_or_none(fn: Callable[[str], str]) -> Callable[[Any], Any]:
    def apply(value: Any) -> Any:
        return None if value is None else fn(to_text(value))

    return apply


def _default(value: Any, fallback: Any = "", boolean: Any = False) -> Any:
    if value is None or (truthy(boolean) and not truthy(value)):
        return fallback
    return value


def _texts(items: Sequence[Any], each: int) -> list[str]:
    """The texts of ``items``, refused (before anything is joined) when they and ``each``
    characters per item would pass ``MAX_RENDER_CHARS``. Each text is measured as it is
    made, so a long list of long values stops at the first text past the limit."""
    check_text_size((), each * len(items))
    texts: list[str] = []
    total = each * len(items)
    for item in items:
        text = to_text(item)
        total += len(text)
        if total > MAX_RENDER_CHARS:
            check_output_size(total)
        texts.append(text)
    return texts


def _join(value: Any, separator: Any = "") -> Any:
    if not is_list(value):
        return value
    sep = to_text(separator)
    return sep.join(_texts(value, len(sep)))


def _bullets(value: Any, prefix: Any = "- ") -> Any:
    if value is None:
        return None
    head = to_text(prefix)
    return "\n".join(head + text for text in _texts(_as_items(value), len(head) + 1))


def _numbered(value: Any, fmt: Any = "[#] ", start: Any = 1) -> Any:
    if value is None:
        return None
    pattern = to_text(fmt)
    first = start if is_real_number(start) and float(start).is_integer() else 1
    items = _as_items(value)
    # each "#" becomes a number no longer than the largest one (and its sign)
    digits = len(str(abs(int(first)) + len(items))) + 1
    texts = _texts(items, len(pattern) + pattern.count("#") * (digits - 1) + 1)
    return "\n".join(pattern.replace("#", str(int(first) + i)) + text for i, text in enumerate(texts))


def _first(value: Any) -> Any:
    if isinstance(value, str) or is_list(value):
        return value[0] if len(value) else None
    return None


def _last(value: Any) -> Any:
    if isinstance(value, str) or is_list(value):
        return value[-1] if len(value) else None
    return None


MAX_INDENT: Final = 256
"""Widest indent the ``indent`` filter applies (a larger number is capped)."""


def _indent(value: Any, width: Any = 4, first: Any = False) -> Any:
    if value is None:
        return None
    if isinstance(width, str):
        pad = width[:MAX_INDENT]
    elif is_real_number(width) and math.isfinite(width):
        pad = " " * max(0, min(MAX_INDENT, int(width)))
    else:
        pad = "    "
    lines = to_text(value).split("\n")
    check_output_size(sum(map(len, lines)) + len(lines) * (len(pad) + 1))
    return "\n".join(
        (pad + line if (i or truthy(first)) and line.strip(JS_WHITESPACE) else line)
        for i, line in enumerate(lines)
    )


def _replace(value: Any, old: Any, new: Any = "") -> Any:
    if value is None:
        return None
    text, old_text, new_text = to_text(value), to_text(old), to_text(new)
    if not old_text:
        return text
    if len(new_text) > len(old_text):
        check_output_size(len(text) + text.count(old_text) * (len(new_text) - len(old_text)))
    return text.replace(old_text, new_text)


def _json_filter(value: Any) -> Any:
    if isinstance(value, str):
        return json_string(value)
    return to_json(value) if value is not None else "null"


@dataclass(frozen=True, slots=True)
class FilterSpec:
    """A filter: ``fn(value, *args)``, how many arguments it takes, one line for the docs."""

    fn: Callable[..., Any]
    min_args: int
    max_args: int
    usage: str


FILTERS: Final[Mapping[str, FilterSpec]] = {
    "default": FilterSpec(_default, 0, 2, 'default("n/a") or default("n/a", true) to replace falsy values'),
    "join": FilterSpec(_join, 0, 1, 'join(", ")'),
    "upper": FilterSpec(_text_or_none(str.upper), 0, 0, "upper"),
    "lower": FilterSpec(_text_or_none(str.lower), 0, 0, "lower"),
    "trim": FilterSpec(_text_or_none(js_trim), 0, 0, "trim"),
    "length": FilterSpec(length, 0, 0, "length"),
    "bullets": FilterSpec(_bullets, 0, 1, 'bullets("  - ")'),
    "numbered": FilterSpec(_numbered, 0, 2, 'numbered or numbered("#. ", 1)'),
    "first": FilterSpec(_first, 0, 0, "first"),
    "last": FilterSpec(_last, 0, 0, "last"),
    "indent": FilterSpec(_indent, 0, 2, "indent(2) or indent(2, true)"),
    "replace": FilterSpec(_replace, 1, 2, 'replace("old", "new")'),
    "json": FilterSpec(_json_filter, 0, 0, "json"),
}
"""Every filter usable as ``{{ value | name(args) }}``."""
