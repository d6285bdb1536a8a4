"""Render-time value semantics of the template language: scopes, lookups, text, equality.

Takes: a render context (``ctx``, a JSON-like mapping), the current forEach item and the loop
frames. Gives: :class:`Scope` (the cheap view leaves and conditions are evaluated against),
path parsing and resolution (:func:`parse_path`, :func:`lookup`, :func:`lookup_scope`), the
reserved sources (:func:`resolve_reserved`), value -> text (:func:`to_text`), structural
equality (:func:`deep_equal`), truthiness, the filters and the named safety limits.

Why it exists: every rule about *values* lives here, in one lookup policy, so the compiled
leaves (:mod:`storyforge.parser`) and the renderer agree byte for byte with the reference
semantics (design/reference-semantics.md §5, §6.2, §7). The policy is strict: only mappings
and sequences have members, nothing is read through Python attributes, and a value that is
neither a scalar nor a container has no members and renders as ``""``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any, Final

from storyforge.errors import RenderLimitError
from storyforge.sources import RESERVED_SOURCES

__all__ = [
    "JS_WHITESPACE",
    "MAX_EXPANSION_DEPTH",
    "MAX_INDENT",
    "MAX_NESTING",
    "MAX_RENDER_CHARS",
    "RESERVED_SOURCES",
    "Frame",
    "Scope",
    "check_output_size",
    "deep_equal",
    "format_number",
    "is_contentful",
    "is_real_number",
    "js_trim",
    "lookup",
    "lookup_scope",
    "parse_path",
    "resolve_reserved",
    "to_json",
    "to_text",
    "truthy",
]

MAX_EXPANSION_DEPTH: Final = 5
"""A string value containing ``{{`` is expanded at most this many levels deep (§5.5)."""

MAX_NESTING: Final = 32
"""Deepest nesting of expressions (parentheses, calls, ``not``) or ``{{#if}}`` blocks."""

MAX_RENDER_CHARS: Final = 1_000_000
"""Longest text one leaf render may produce; more raises :class:`RenderLimitError`."""

JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
"""What JavaScript's ``String.prototype.trim`` removes (unlike ``str.strip()``: adds ``\\ufeff``,
leaves ``\\x1c``-``\\x1f`` and ``\\x85``)."""


def js_trim(text: str) -> str:
    """``text`` without leading/trailing whitespace, with JavaScript ``trim`` semantics."""
    return text.strip(JS_WHITESPACE)


def is_contentful(text: str) -> bool:
    """True when ``text`` has a character that JavaScript ``trim`` would keep."""
    return bool(text.strip(JS_WHITESPACE))


def check_output_size(size: int) -> None:
    """Raise :class:`RenderLimitError` when one leaf render grew past ``MAX_RENDER_CHARS``."""
    if size > MAX_RENDER_CHARS:
        raise RenderLimitError(
            f"a template string rendered to more than MAX_RENDER_CHARS={MAX_RENDER_CHARS:,} "
            "characters; check for data that expands itself or for very long lists"
        )


# ---------------------------------------------------------------------------------------------
# Scope and loop frames


@dataclass(frozen=True, slots=True)
class Frame:
    """One forEach iteration: the item and its 0-based position in the ordered, limited list."""

    item: Any
    index: int


class Scope:
    """What a leaf or condition sees: ``{"ctx": ctx, **ctx, "item": item}`` without building it.

    ``frames`` is the chain of enclosing forEach iterations, innermost last; it backs the
    reserved names ``$item``, ``$index`` and ``$parent``. A scope is never mutated:
    :meth:`push` returns a new one, so scopes are safe to share between threads.
    """

    __slots__ = ("ctx", "frames", "item")

    def __init__(self, ctx: Any, item: Any = None, frames: tuple[Frame, ...] = ()) -> None:
        self.ctx = ctx
        self.item = item
        self.frames = frames

    def push(self, item: Any, index: int) -> Scope:
        """The scope of one forEach iteration over ``item`` at ``index``."""
        return Scope(self.ctx, item, (*self.frames, Frame(item, index)))

    def __repr__(self) -> str:
        return f"Scope(item={self.item!r}, depth={len(self.frames)})"


# ---------------------------------------------------------------------------------------------
# Paths and the lookup policy


@lru_cache(maxsize=8192)
def parse_path(text: str) -> tuple[str, ...]:
    """Split a reference path into segments (§5.3).

    ``.`` ends a segment (empty segments are skipped); ``[...]`` is one verbatim segment
    (it may hold dots or be empty); a ``[`` without a closing ``]`` is an ordinary character.
    ``"a[0].b"``, ``"a.[0].b"`` and ``"a.0.b"`` all give ``("a", "0", "b")``.
    """
    segments: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == ".":
            if current:
                segments.append("".join(current))
                current = []
        elif ch == "[" and (close := text.find("]", i + 1)) != -1:
            if current:
                segments.append("".join(current))
                current = []
            segments.append(text[i + 1 : close])
            i = close
        else:
            current.append(ch)
        i += 1
    if current:
        segments.append("".join(current))
    return tuple(segments)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, memoryview))


def _index(items: Sequence[Any], segment: str) -> tuple[bool, Any]:
    """A list member: ``length`` or a canonical non-negative integer index within bounds."""
    if segment == "length":
        return True, len(items)
    if segment.isascii() and segment.isdigit() and (segment[0] != "0" or segment == "0"):
        index = int(segment)
        if index < len(items):
            return True, items[index]
    return False, None


def lookup(value: Any, segments: tuple[str, ...]) -> tuple[bool, Any]:
    """Walk ``segments`` from ``value`` reading own keys only; return ``(found, value)`` (§5.4).

    Mappings answer keys they hold (even with a ``None`` value); lists and tuples answer
    canonical indices (``"0"``, ``"12"``; not ``"-1"``, ``"01"``) and ``length``. Strings,
    numbers and every other object have no members.
    """
    for segment in segments:
        cls = value.__class__
        if cls is dict:
            if segment in value:
                value = value[segment]
                continue
            return False, None
        if cls is list or cls is tuple:
            found, value = _index(value, segment)
        elif isinstance(value, Mapping):
            try:
                if segment not in value:
                    return False, None
                value = value[segment]
            except (KeyError, TypeError):
                return False, None
            continue
        elif _is_sequence(value):
            found, value = _index(value, segment)
        else:
            return False, None
        if not found:
            return False, None
    return True, value


def _scope_root(scope: Scope, name: str) -> tuple[bool, Any]:
    """The first path segment against ``{"ctx": ctx, **ctx, "item": item}``."""
    if name == "item":
        return True, scope.item
    ctx = scope.ctx
    if isinstance(ctx, Mapping) and name in ctx:
        return True, ctx[name]
    if name == "ctx":
        return True, ctx
    return False, None


def _globals_of(scope: Scope) -> Any:
    ctx = scope.ctx
    if isinstance(ctx, Mapping):
        return ctx.get("globals")
    return None


def lookup_scope(scope: Scope, segments: Sequence[str]) -> Any:
    """Resolve a leaf path against the scope, falling back to ``ctx.globals`` (§5.2, §5.4).

    The globals fallback retries the *whole* path from ``ctx["globals"]`` only when the path
    was not found (a key holding ``None`` counts as found). An empty path gives ``None``
    (decision #3). Returns ``None`` when nothing is found.
    """
    segments = tuple(segments)
    if not segments:
        return None
    found, value = _scope_root(scope, segments[0])
    if found and len(segments) > 1:
        found, value = lookup(value, segments[1:])
    if found:
        return value
    found, value = lookup(_globals_of(scope), segments)
    return value if found else None


def resolve_reserved(source: str, args: Any, scope: Scope) -> Any:
    """Value of a reserved DataRef (``$item``, ``$index``, ``$parent``, ``$globals``, ``$ctx``).

    §6.2: ``args.path`` (a non-empty string) is applied with the leaf path rules but without
    the globals fallback; ``$parent`` takes ``args.level`` (default 1, raised to at least 1,
    a non-number counts as 1). Outside loops ``$item``, ``$index`` and ``$parent`` are absent.
    Any other name gives ``None``.
    """
    frames = scope.frames
    if source == "$item":
        if not frames:
            return None
        value = frames[-1].item
    elif source == "$index":
        return frames[-1].index if frames else None
    elif source == "$parent":
        level: Any = args.get("level", 1) if isinstance(args, Mapping) else 1
        if isinstance(level, bool) or not isinstance(level, numbers.Real):
            level = 1
        if math.isnan(level):
            return None  # NaN: Math.max(1, NaN) is NaN, which names no frame
        level = max(1, level)
        if isinstance(level, float) or not isinstance(level, int):
            if not float(level).is_integer():
                return None  # a fractional or infinite level names no frame
            level = int(level)
        if level >= len(frames):
            return None
        value = frames[-1 - level].item
    elif source == "$globals":
        ctx = scope.ctx
        if not (isinstance(ctx, Mapping) and "globals" in ctx):
            return None
        value = ctx["globals"]
    elif source == "$ctx":
        value = scope.ctx
    else:
        return None
    path = args.get("path") if isinstance(args, Mapping) else None
    if isinstance(path, str) and path:
        found, value = lookup(value, parse_path(path))
        return value if found else None
    return value


# ---------------------------------------------------------------------------------------------
# Values -> text


def format_number(number: float) -> str:
    """``Number.prototype.toString`` of a float: ``2.0 -> "2"``, ``1e21 -> "1e+21"`` (§5.5)."""
    if math.isnan(number):
        return "NaN"
    if number in (math.inf, -math.inf):
        return "Infinity" if number > 0 else "-Infinity"
    if number == 0:
        return "0"
    if number.is_integer() and abs(number) < 2.0**53:
        return str(int(number))
    sign = "-" if number < 0 else ""
    mantissa, _, exp_text = float.__repr__(abs(number)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + (int(exp_text) if exp_text else 0)  # value = 0.digits * 10**point
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        text = digits + "0" * (point - k)
    elif 0 < point <= 21:
        text = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        text = "0." + "0" * -point + digits
    else:
        exponent = point - 1
        head = digits[0] + ("." + digits[1:] if k > 1 else "")
        text = f"{head}e{'+' if exponent >= 0 else '-'}{abs(exponent)}"
    return sign + text


class _Unencodable(Exception):
    """Raised inside :func:`to_json` for a circular structure or an unusable key."""


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return to_text(key) if key is not None else "null"
    raise _Unencodable


def _encode(value: Any, out: list[str], active: set[int]) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, str):
        out.append(encode_basestring(value))
    elif value is True or value is False:
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(format_number(value) if math.isfinite(value) else "null")
    elif isinstance(value, Mapping):
        marker = id(value)
        if marker in active:
            raise _Unencodable
        active.add(marker)
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(encode_basestring(_json_key(key)))
            out.append(":")
            _encode(item, out, active)
        out.append("}")
        active.discard(marker)
    elif isinstance(value, (list, tuple)) or _is_sequence(value):
        marker = id(value)
        if marker in active:
            raise _Unencodable
        active.add(marker)
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out, active)
        out.append("]")
        active.discard(marker)
    elif isinstance(value, numbers.Integral):
        out.append(str(int(value)))
    elif isinstance(value, numbers.Real):
        number = float(value)
        out.append(format_number(number) if math.isfinite(number) else "null")
    else:
        out.append("null")  # objects that are neither scalars nor containers have no members


def to_json(value: Any) -> str:
    """Compact JSON as ``JSON.stringify`` writes it; ``""`` when it cannot be encoded (§5.5).

    No spaces, insertion order, non-ASCII unescaped, numbers in JavaScript form, NaN and
    infinities as ``null``; a circular structure gives ``""``.
    """
    out: list[str] = []
    try:
        _encode(value, out, set())
    except (_Unencodable, RecursionError):
        return ""
    return "".join(out)


def to_text(value: Any) -> str:
    """The text a value renders as (§5.5).

    ``None`` -> ``""``; strings unchanged; ``True`` -> ``"true"``; numbers in JavaScript
    form (``2.0`` -> ``"2"``, ints exact); mappings and sequences as compact JSON; any other
    object -> ``""`` (it has no members and is never asked for its ``str()``).
    """
    cls = value.__class__
    if cls is str:
        return value  # type: ignore[no-any-return]
    if value is None:
        return ""
    if cls is bool:
        return "true" if value else "false"
    if cls is int:
        return int.__repr__(value)
    if cls is float:
        return format_number(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (Mapping, list, tuple)) or _is_sequence(value):
        return to_json(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return format_number(float(value))
    return ""


# ---------------------------------------------------------------------------------------------
# Truth, numbers, equality


def is_real_number(value: Any) -> bool:
    """True for ints and floats that are not NaN; booleans are not numbers here (§7)."""
    cls = value.__class__
    if cls is int:
        return True
    if cls is float:
        return not math.isnan(value)
    if cls is bool or isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        number = float(value)
        return not math.isnan(number)
    return False


def truthy(value: Any) -> bool:
    """Truthiness for ``and``/``or``/``not`` and ``{{#if}}``.

    ``None``, ``False``, ``0``, NaN, ``""`` and empty lists/mappings are false; every other
    value (including objects without members) is true. No ``__bool__`` is ever called.
    """
    if value is None:
        return False
    cls = value.__class__
    if cls is bool:
        return value  # type: ignore[no-any-return]
    if cls is str:
        return bool(value != "")
    if cls is int:
        return bool(value != 0)
    if cls is float:
        return not math.isnan(value) and value != 0
    if isinstance(value, (str, Mapping, list, tuple)) or _is_sequence(value):
        return len(value) > 0
    if isinstance(value, numbers.Real):
        return is_real_number(value) and float(value) != 0
    return True


class _Circular(Exception):
    """A value to compare contains itself."""


def _canonical(value: Any, active: set[int]) -> Any:
    """A hashable, key-order-free image of a value as JSON would see it."""
    if value is None:
        return ("null",)
    if value is True or value is False:
        return ("bool", value)
    if isinstance(value, str):
        return ("str", str.__str__(value))
    if isinstance(value, numbers.Real):
        number = float(value) if not isinstance(value, int) else value
        if isinstance(number, float) and not math.isfinite(number):
            return ("null",)  # JSON writes NaN and infinities as null
        return ("num", number)
    if isinstance(value, (Mapping, list, tuple)) or _is_sequence(value):
        marker = id(value)
        if marker in active:
            raise _Circular
        active.add(marker)
        try:
            if isinstance(value, Mapping):
                try:
                    items = {_json_key(k): _canonical(v, active) for k, v in value.items()}
                except _Unencodable:
                    raise _Circular from None
                return ("map", frozenset(items.items()))
            return ("list", tuple(_canonical(v, active) for v in value))
        finally:
            active.discard(marker)
    return ("null",)


def deep_equal(a: Any, b: Any) -> bool:
    """``eq`` semantics (§7 plus decision #4).

    No coercion (``"5" != 5``, ``True != 1`` at every depth, ``2.0 == 2``); ``None`` equals only
    ``None``; NaN never equals itself at the top level; mappings and lists compare as JSON
    structures with key order ignored; a circular value equals only itself.
    """
    if a is None or b is None:
        return a is None and b is None
    a_bool, b_bool = a.__class__ is bool, b.__class__ is bool
    if a_bool or b_bool:
        return a_bool and b_bool and a is b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and str.__eq__(a, b)
    a_num = isinstance(a, numbers.Real) and not isinstance(a, bool)
    b_num = isinstance(b, numbers.Real) and not isinstance(b, bool)
    if a_num or b_num:
        return a_num and b_num and a == b
    if isinstance(a, (Mapping, list, tuple)) or _is_sequence(a) or isinstance(b, (Mapping, list, tuple)):
        try:
            return bool(_canonical(a, set()) == _canonical(b, set()))
        except (_Circular, RecursionError):
            return a is b
    return a is b


def compare_numbers(op: str, a: Any, b: Any) -> bool:
    """``<``, ``<=``, ``>``, ``>=``: true only when both sides are real numbers (§7 gt/lt)."""
    if not (is_real_number(a) and is_real_number(b)):
        return False
    if op == ">":
        return bool(a > b)
    if op == "<":
        return bool(a < b)
    if op == ">=":
        return bool(a >= b)
    return bool(a <= b)


def contains(container: Any, needle: Any) -> bool:
    """``needle in container``: list membership by :func:`deep_equal`, substring, mapping key."""
    if isinstance(container, str):
        return isinstance(needle, str) and needle in container
    if isinstance(container, Mapping):
        return isinstance(needle, str) and needle in container
    if isinstance(container, (list, tuple)) or _is_sequence(container):
        return any(deep_equal(needle, item) for item in container)
    return False


def length(value: Any) -> int | None:
    """Items in a list or mapping, characters in a string; ``None`` for anything else."""
    if isinstance(value, (str, Mapping, list, tuple)) or _is_sequence(value):
        return len(value)
    return None


def non_empty(value: Any) -> bool:
    """``nonEmpty`` (§7): a non-empty list or string. Mappings and numbers are never non-empty."""
    if isinstance(value, str):
        return len(value) > 0
    if isinstance(value, (list, tuple)) or _is_sequence(value):
        return len(value) > 0
    return False


def arithmetic(op: str, a: Any, b: Any) -> Any:
    """``+`` and ``-``: numbers add and subtract; ``+`` with a string side joins the texts.

    Anything else (``None``, booleans, lists) gives ``None``.
    """
    if is_real_number(a) and is_real_number(b):
        return a + b if op == "+" else a - b
    if op == "+" and (isinstance(a, str) or isinstance(b, str)) and a is not None and b is not None:
        return to_text(a) + to_text(b)
    return None


def negate(value: Any) -> Any:
    """Unary minus on a real number; ``None`` for anything else."""
    if is_real_number(value) or (isinstance(value, float) and math.isnan(value)):
        return -value
    return None


# ---------------------------------------------------------------------------------------------
# Filters: value -> value. Each is total: a value it cannot handle passes through unchanged or
# becomes None, it never raises.


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or _is_sequence(value)


def _as_items(value: Any) -> Sequence[Any]:
    if value is None:
        return ()
    if _is_list(value):
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


def _join(value: Any, separator: Any = "") -> Any:
    if not _is_list(value):
        return value
    return to_text(separator).join(to_text(item) for item in value)


def _bullets(value: Any, prefix: Any = "- ") -> Any:
    if value is None:
        return None
    head = to_text(prefix)
    return "\n".join(head + to_text(item) for item in _as_items(value))


def _numbered(value: Any, fmt: Any = "[#] ", start: Any = 1) -> Any:
    if value is None:
        return None
    pattern = to_text(fmt)
    first = start if is_real_number(start) and float(start).is_integer() else 1
    return "\n".join(
        pattern.replace("#", str(int(first) + i)) + to_text(item) for i, item in enumerate(_as_items(value))
    )


def _first(value: Any) -> Any:
    if isinstance(value, str) or _is_list(value):
        return value[0] if len(value) else None
    return None


def _last(value: Any) -> Any:
    if isinstance(value, str) or _is_list(value):
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
        return encode_basestring(value)
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

FUNCTIONS: Final[Mapping[str, tuple[int, int]]] = {
    "len": (1, 1),
    "exists": (1, 1),
    "nonEmpty": (1, 1),
    "source": (1, 2),
}
"""Functions callable in expressions, with their (min, max) argument counts."""


# ---------------------------------------------------------------------------------------------
# Evaluation: AST -> closures, built once at compile time. Nothing here generates source code.

Evaluator = Callable[["Scope", Any], Any]
"""``fn(scope, resolve)``: the value of an expression; ``resolve`` is ``None`` inside leaves."""

HoleFn = Callable[["Scope", int], str]
"""``fn(scope, depth)``: the final text of one placeholder."""


def _get_item(scope: Scope) -> Any:
    return scope.item


def path_getter(segments: tuple[str, ...]) -> Callable[[Scope], Any]:
    """A closure resolving one leaf path, specialised for the common shapes (§5.2, §5.4)."""
    if not segments:
        return lambda scope: None
    head, rest = segments[0], segments[1:]
    if head == "item" and not rest:
        return _get_item
    if head == "item" and len(rest) == 1:
        key = rest[0]

        def get_item_key(scope: Scope) -> Any:
            item = scope.item
            if item.__class__ is dict and key in item:
                return item[key]
            return lookup_scope(scope, segments)

        return get_item_key
    if head in ("item", "ctx"):
        return lambda scope: lookup_scope(scope, segments)

    def get(scope: Scope) -> Any:
        ctx = scope.ctx
        if ctx.__class__ is not dict:
            return lookup_scope(scope, segments)
        if head in ctx:
            value = ctx[head]
            if not rest:
                return value
            found, value = lookup(value, rest)
            if found:
                return value
        fallback = ctx.get("globals")
        if fallback is None:
            return None
        found, value = lookup(fallback, segments)
        return value if found else None

    return get


def expand(text: str, scope: Scope, depth: int) -> str:
    """Render a resolved string that contains ``{{`` against the same scope (§5.5).

    ``depth`` is the depth of the template the string was read in; the expansion renders at
    ``depth + 1`` and a template deeper than ``MAX_EXPANSION_DEPTH`` is kept literally, as is
    a string that is not a valid template.
    """
    if depth >= MAX_EXPANSION_DEPTH:
        return text
    from storyforge.parser import compile_expansion  # parser imports this module

    leaf = compile_expansion(text)
    if leaf is None:
        return text
    return leaf.render(scope, depth + 1)[0]


def _reserved_evaluator(name: str, segments: tuple[str, ...]) -> Evaluator:
    if name == "$index" and not segments:
        return lambda scope, resolve: scope.frames[-1].index if scope.frames else None

    def evaluate(scope: Scope, resolve: Any) -> Any:
        frames = scope.frames
        if name == "$item":
            if not frames:
                return None
            value = frames[-1].item
        elif name == "$parent":
            if len(frames) < 2:
                return None
            value = frames[-2].item
        else:
            value = resolve_reserved(name, None, scope)
        if not segments:
            return value
        found, value = lookup(value, segments)
        return value if found else None

    return evaluate


def compile_expr(node: Any) -> Evaluator:
    """The evaluator of one expression node (recursion is bounded by ``MAX_NESTING``)."""
    from storyforge import nodes as n

    if isinstance(node, n.Literal):
        value = node.value
        return lambda scope, resolve: value
    if isinstance(node, n.Path):
        get = path_getter(node.segments)
        return lambda scope, resolve: get(scope)
    if isinstance(node, n.Reserved):
        return _reserved_evaluator(node.name, node.segments)
    if isinstance(node, n.Ref):
        source, args = node.source, node.args

        def read(scope: Scope, resolve: Any) -> Any:
            if resolve is None:
                return resolve_reserved(source, args, scope)
            return resolve(source, args)

        return read
    if isinstance(node, n.ListExpr):
        items = tuple(compile_expr(item) for item in node.items)
        return lambda scope, resolve: [item(scope, resolve) for item in items]
    if isinstance(node, n.DictExpr):
        pairs = tuple((key, compile_expr(value)) for key, value in node.items)
        return lambda scope, resolve: {key: value(scope, resolve) for key, value in pairs}
    if isinstance(node, n.Not):
        operand = compile_expr(node.operand)
        return lambda scope, resolve: not truthy(operand(scope, resolve))
    if isinstance(node, n.Neg):
        operand = compile_expr(node.operand)
        return lambda scope, resolve: negate(operand(scope, resolve))
    if isinstance(node, n.BoolOp):
        return _bool_op(node.op == "and", tuple(compile_expr(o) for o in node.operands))
    if isinstance(node, n.Compare):
        return _compare(node.op, compile_expr(node.left), compile_expr(node.right))
    if isinstance(node, n.Arith):
        first = compile_expr(node.first)
        rest = tuple((op, compile_expr(operand)) for op, operand in node.rest)

        def arith(scope: Scope, resolve: Any) -> Any:
            value = first(scope, resolve)
            for op, operand in rest:
                value = arithmetic(op, value, operand(scope, resolve))
            return value

        return arith
    if isinstance(node, n.Call):
        return _call(node.name, tuple(compile_expr(arg) for arg in node.args))
    if isinstance(node, n.Pipe):
        head = compile_expr(node.value)
        stages = compile_filters(node.filters)

        def pipe(scope: Scope, resolve: Any) -> Any:
            value = head(scope, resolve)
            for fn, args in stages:
                value = fn(value, *[arg(scope, resolve) for arg in args])
            return value

        return pipe
    raise TypeError(f"not an expression node: {node!r}")


def compile_filters(filters: Sequence[Any]) -> tuple[tuple[Callable[..., Any], tuple[Evaluator, ...]], ...]:
    """``(fn, argument evaluators)`` per pipeline stage (names were checked by the parser)."""
    return tuple((FILTERS[f.name].fn, tuple(compile_expr(arg) for arg in f.args)) for f in filters)


def _bool_op(is_and: bool, operands: tuple[Evaluator, ...]) -> Evaluator:
    def evaluate(scope: Scope, resolve: Any) -> Any:
        value = None
        for operand in operands:
            value = operand(scope, resolve)
            if truthy(value) is not is_and:
                return value
        return value

    return evaluate


def _compare(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    if op == "==":
        return lambda scope, resolve: deep_equal(left(scope, resolve), right(scope, resolve))
    if op == "!=":
        return lambda scope, resolve: not deep_equal(left(scope, resolve), right(scope, resolve))
    if op == "in":
        return lambda scope, resolve: contains(right(scope, resolve), left(scope, resolve))
    if op == "not in":
        return lambda scope, resolve: not contains(right(scope, resolve), left(scope, resolve))
    return lambda scope, resolve: compare_numbers(op, left(scope, resolve), right(scope, resolve))


def _call(name: str, args: tuple[Evaluator, ...]) -> Evaluator:
    (arg,) = args[:1] or (None,)
    assert arg is not None, f"{name}() compiled without its argument"
    if name == "len":
        return lambda scope, resolve: length(arg(scope, resolve))
    if name == "exists":
        return lambda scope, resolve: arg(scope, resolve) is not None
    if name == "nonEmpty":
        return lambda scope, resolve: non_empty(arg(scope, resolve))
    raise TypeError(f"function {name!r} has no evaluator")


def compile_hole(node: Any) -> HoleFn:
    """The text function of an output placeholder.

    The value an expression (or a pipeline's first stage) produces is expanded when it is a
    string containing ``{{``; filter results are not expanded again.
    """
    from storyforge import nodes as n

    if isinstance(node, n.Path):
        segments = node.segments
        get = path_getter(segments)
        if len(segments) == 1 and segments[0] not in ("item", "ctx"):
            key = segments[0]

            def plain_key(scope: Scope, depth: int) -> str:
                ctx = scope.ctx
                value = ctx[key] if ctx.__class__ is dict and key in ctx else get(scope)
                if value.__class__ is str:
                    return expand(value, scope, depth) if "{{" in value else value
                return to_text(value)

            return plain_key

        def plain(scope: Scope, depth: int) -> str:
            value = get(scope)
            if value.__class__ is str:
                return expand(value, scope, depth) if "{{" in value else value
            return to_text(value)

        return plain
    head = compile_expr(node.value if isinstance(node, n.Pipe) else node)
    stages = compile_filters(node.filters) if isinstance(node, n.Pipe) else ()

    def hole(scope: Scope, depth: int) -> str:
        value = head(scope, None)
        if isinstance(value, str) and "{{" in value:
            value = expand(value, scope, depth)
        for fn, args in stages:
            value = fn(value, *[arg(scope, None) for arg in args])
        return to_text(value)

    return hole


Emitter = Callable[["Scope", int, list[str], list[int]], bool]
"""``fn(scope, depth, out, size)``: appends text to ``out``, keeps ``size[0]`` = its length,
returns whether anything contentful was produced."""


def _text_step(text: str) -> Emitter:
    def emit(scope: Scope, depth: int, out: list[str], size: list[int]) -> bool:
        out.append(text)
        size[0] += len(text)
        return False

    return emit


def _output_step(hole: HoleFn) -> Emitter:
    def emit(scope: Scope, depth: int, out: list[str], size: list[int]) -> bool:
        text = hole(scope, depth)
        out.append(text)
        size[0] += len(text)
        check_output_size(size[0])
        return is_contentful(text)

    return emit


def _compile_block(parts: Sequence[Any]) -> Emitter:
    """An emitter for a part list (text, placeholders and nested ``{{#if}}`` blocks)."""
    from storyforge import nodes as n

    steps: list[Emitter] = []
    for part in parts:
        if isinstance(part, n.Text):
            steps.append(_text_step(part.value))
        elif isinstance(part, n.Output):
            steps.append(_output_step(compile_hole(part.expr)))
        else:
            steps.append(_compile_if(part))

    def emit(scope: Scope, depth: int, out: list[str], size: list[int]) -> bool:
        contentful = False
        for step in steps:
            if step(scope, depth, out, size):
                contentful = True
        return contentful

    return emit


def _compile_if(block: Any) -> Emitter:
    test = compile_expr(block.test)
    then = _compile_block(block.then)
    otherwise = _compile_block(block.otherwise) if block.otherwise is not None else None

    def run(scope: Scope, depth: int, out: list[str], size: list[int]) -> bool:
        start = len(out)
        if truthy(test(scope, None)):
            contentful = then(scope, depth, out, size)
        elif otherwise is not None:
            contentful = otherwise(scope, depth, out, size)
        else:
            return False
        # literal text inside a taken branch counts as content: the branch was chosen by data
        return contentful or any(is_contentful(piece) for piece in out[start:])

    return run


def compile_parts(parts: Sequence[Any]) -> Callable[..., tuple[str, bool]]:
    """``render(scope, depth=0) -> (text, contentful)`` for a leaf's parts, specialised by shape."""
    from storyforge import nodes as n

    if not any(isinstance(p, (n.Output, n.IfBlock)) for p in parts):
        constant = ("".join(p.value for p in parts), False)
        return lambda scope, depth=0: constant

    if any(isinstance(p, n.IfBlock) for p in parts):
        emit = _compile_block(parts)

        def render_blocks(scope: Scope, depth: int = 0) -> tuple[str, bool]:
            out: list[str] = []
            contentful = emit(scope, depth, out, [0])
            return "".join(out), contentful

        return render_blocks

    holes = [p for p in parts if isinstance(p, n.Output)]
    if len(holes) == 1:
        index = next(i for i, p in enumerate(parts) if isinstance(p, n.Output))
        prefix = "".join(p.value for p in parts[:index])
        suffix = "".join(p.value for p in parts[index + 1 :])
        hole = compile_hole(holes[0].expr)
        fixed = len(prefix) + len(suffix)

        def render_one(scope: Scope, depth: int = 0) -> tuple[str, bool]:
            text = hole(scope, depth)
            if len(text) + fixed > MAX_RENDER_CHARS:
                check_output_size(len(text) + fixed)
            return prefix + text + suffix, bool(text.strip(JS_WHITESPACE))

        return render_one

    # Literal text goes into one str.format pattern (braces escaped), so joining the pieces
    # is a single C call; only the placeholders run Python code.
    pattern = "".join(
        p.value.replace("{", "{{").replace("}", "}}") if isinstance(p, n.Text) else "{}" for p in parts
    )
    hole_fns = tuple(compile_hole(p.expr) for p in parts if isinstance(p, n.Output))
    literal_size = sum(len(p.value) for p in parts if isinstance(p, n.Text))

    def render_many(scope: Scope, depth: int = 0) -> tuple[str, bool]:
        texts: list[str] = []
        size = literal_size
        contentful = False
        for hole in hole_fns:
            text = hole(scope, depth)
            size += len(text)
            if size > MAX_RENDER_CHARS:
                check_output_size(size)
            if not contentful and text.strip(JS_WHITESPACE):
                contentful = True
            texts.append(text)
        return pattern.format(*texts), contentful

    return render_many
