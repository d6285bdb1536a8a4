"""Render-time value semantics of the template language: scopes, lookups, text, equality.

Takes: a render context (``ctx``, a JSON-like mapping), the current forEach item and the loop
frames. Gives: :class:`Scope` (the cheap view leaves and conditions are evaluated against),
path parsing and resolution (:func:`parse_path`, :func:`lookup`, :func:`lookup_scope`), the
reserved sources (:func:`resolve_reserved`), value -> text (:func:`to_text`, :func:`to_json`),
structural equality (:func:`deep_equal`), truthiness, the comparison and arithmetic operators,
and the named safety limits.

Why it exists: every rule about *values* lives here, in one lookup policy, so the compiled
leaves (:mod:`storyforge.engine.evaluator`), the filters (:mod:`storyforge.engine.filters`) and the renderer
agree byte for byte with the reference semantics (docs/reference-semantics.md §5, §6.2, §7).
The policy is strict: only mappings and sequences have members, nothing is read through
Python attributes, and a value that is neither a scalar nor a container has no members and
renders as ``""``.
"""

from __future__ import annotations

import math
import numbers
import re
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any, Final, NamedTuple

from storyforge.engine.errors import RenderLimitError
from storyforge.engine.sources import RESERVED_SOURCES

__all__ = [
    "EXPANDS",
    "JS_WHITESPACE",
    "MAX_EXPANSION_DEPTH",
    "MAX_JSON_DEPTH",
    "MAX_NESTING",
    "MAX_OUTPUT_CHARS",
    "MAX_RENDER_CHARS",
    "MAX_RENDER_ITEMS",
    "RENDER_NOTES",
    "RESERVED_SOURCES",
    "Frame",
    "Scope",
    "arithmetic",
    "check_output_size",
    "check_text_size",
    "compare_numbers",
    "contains",
    "deep_equal",
    "expand",
    "expands",
    "format_number",
    "from_text",
    "is_contentful",
    "is_list",
    "is_real_number",
    "js_trim",
    "json_string",
    "length",
    "lookup",
    "lookup_scope",
    "negate",
    "non_empty",
    "note",
    "parse_path",
    "render_reference",
    "resolve_reserved",
    "restore_data_expansion",
    "set_data_expansion",
    "take_notes",
    "to_json",
    "to_text",
    "too_many_items",
    "too_much_output",
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


MAX_RENDER_ITEMS: Final = 250_000
"""Most forEach items one render may visit, counted over every loop as they are visited
(nested loops multiply); one more raises :class:`RenderLimitError`."""

MAX_OUTPUT_CHARS: Final = 16 * 1024 * 1024
"""Most characters the messages of one render may hold, counted as each message is emitted
(a safety limit, not a budget: about four million tokens)."""

MAX_JSON_DEPTH: Final = 500
"""Deepest nesting of lists and mappings written as JSON (``{{value}}`` of a container, the
``json`` filter, ``from``); a deeper value renders ``""`` with a warning."""


def check_output_size(size: int) -> None:
    """Raise :class:`RenderLimitError` when one leaf render grew past ``MAX_RENDER_CHARS``."""
    if size > MAX_RENDER_CHARS:
        raise RenderLimitError(
            f"a template string rendered to more than MAX_RENDER_CHARS={MAX_RENDER_CHARS:,} "
            "characters; check for data that expands itself or for very long lists",
            limit="MAX_RENDER_CHARS",
        )


def check_text_size(sizes: Sequence[int], extra: int = 0) -> None:
    """Raise before joining texts of these ``sizes`` (plus ``extra`` characters of separators
    or prefixes) when the result would pass ``MAX_RENDER_CHARS``."""
    total = extra
    for size in sizes:
        total += size
        if total > MAX_RENDER_CHARS:
            check_output_size(total)


def too_many_items(count: int) -> None:
    """Raise :class:`RenderLimitError`: the render visited ``count`` > ``MAX_RENDER_ITEMS`` items."""
    raise RenderLimitError(
        f"the render visited more than MAX_RENDER_ITEMS={MAX_RENDER_ITEMS:,} forEach items "
        f"({count:,}); check for nested loops over long lists or use a limit",
        limit="MAX_RENDER_ITEMS",
    )


def too_much_output(total: int) -> None:
    """Raise :class:`RenderLimitError`: the messages so far hold ``total`` > ``MAX_OUTPUT_CHARS``."""
    raise RenderLimitError(
        f"the rendered messages hold {total:,} characters, above MAX_OUTPUT_CHARS="
        f"{MAX_OUTPUT_CHARS:,}; check for loops that repeat long texts",
        limit="MAX_OUTPUT_CHARS",
    )


# ---------------------------------------------------------------------------------------------
# Per-render settings and notes (data expansion, warnings from deep inside a value)


class _RenderNotes(threading.local):
    """Per thread: the expansion setting of the render running in it, and the warnings its
    value rules noted (``None`` until the first). A render is synchronous, so the render
    running in a thread is the one these belong to; reading them costs one attribute
    lookup, which is all a render that notes nothing pays."""

    expand = True
    warnings: dict[str, None] | None = None

    def __init__(self) -> None:
        # Set per thread, not left to the class defaults: an attribute in the thread's own
        # dict reads in half the time (this is read twice in every render).
        self.expand = True
        self.warnings = None


_NOTES = RENDER_NOTES = _RenderNotes()
"""The per-thread notes (``RENDER_NOTES.warnings`` is read after each render)."""


def set_data_expansion(mode: str) -> bool:
    """Set the running render's expansion (``paths`` or ``off``); returns the previous one."""
    previous = _NOTES.expand
    _NOTES.expand = mode != "off"
    return previous


def restore_data_expansion(previous: bool) -> None:
    """Put back what :func:`set_data_expansion` returned."""
    _NOTES.expand = previous


def take_notes() -> list[str] | None:
    """The warnings noted since the last call (``None`` when there were none)."""
    warnings = _NOTES.warnings
    if warnings is None:
        return None
    _NOTES.warnings = None
    return list(warnings)


def note(message: str) -> None:
    """Record a warning of the running render from inside the value rules (deduplicated, at
    most 20 per render)."""
    warnings = _NOTES.warnings
    if warnings is None:
        _NOTES.warnings = {message: None}
    elif len(warnings) < 20:
        warnings[message] = None


# ---------------------------------------------------------------------------------------------
# Scope and loop frames


class Frame(NamedTuple):
    """One forEach iteration: the item and its 0-based position in the ordered, limited list.

    A named tuple rather than a frozen dataclass: as immutable, and cheaper to make."""

    item: Any
    index: int  # type: ignore[assignment]  # the field, not tuple.index: frames are never searched


class Scope:
    """What a leaf or condition sees: ``{"ctx": ctx, **ctx, "item": item}`` without building it.

    ``frames`` is the chain of enclosing forEach iterations, innermost last; it backs the
    reserved names ``$item``, ``$index`` and ``$parent``. A loop item's scope keeps only its
    enclosing scope and index, and makes its frames when they are first read (most renders
    never read them). A scope is never changed once made (its frames, made once, are always
    the same): :meth:`push` returns a new one, so scopes are safe to share between threads.
    """

    __slots__ = ("_frames", "ctx", "index", "item", "parent")

    def __init__(
        self,
        ctx: Any,
        item: Any = None,
        frames: tuple[Frame, ...] | None = (),
        parent: Scope | None = None,
        index: int = 0,
    ) -> None:
        self.ctx = ctx
        self.item = item
        self._frames = frames  # None: the frames of `parent`, then (item, index)
        self.parent = parent
        self.index = index

    @property
    def frames(self) -> tuple[Frame, ...]:
        frames = self._frames
        if frames is None:
            assert self.parent is not None
            frames = self._frames = (*self.parent.frames, Frame(self.item, self.index))
        return frames

    def push(self, item: Any, index: int) -> Scope:
        """The scope of one forEach iteration over ``item`` at ``index``."""
        return Scope(self.ctx, item, None, self, index)

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


_MEMBERLESS = frozenset({str, int, float, bool, type(None)})
"""Exact types with no members to walk into (decided without the abstract-class checks)."""


def _is_sequence(value: Any) -> bool:
    if value.__class__ in _MEMBERLESS:
        return False
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, memoryview))


def is_list(value: Any) -> bool:
    """True for lists, tuples and other non-text sequences: the values with items and ``length``."""
    return isinstance(value, (list, tuple)) or _is_sequence(value)


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
        elif cls in _MEMBERLESS:
            return False, None
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
    if (ctx.__class__ is dict or isinstance(ctx, Mapping)) and name in ctx:
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


def resolve_reserved(source: str, args: Any, scope: Scope, absent: Any = None) -> Any:
    """Value of a reserved DataRef (``$item``, ``$index``, ``$parent``, ``$globals``, ``$ctx``).

    §6.2: ``args.path`` (a non-empty string) is applied with the leaf path rules but without
    the globals fallback; ``$parent`` takes ``args.level`` (default 1, raised to at least 1,
    a non-number counts as 1). Outside loops ``$item``, ``$index`` and ``$parent`` are absent.
    Any other name is absent. An absent value is returned as ``absent`` (``None`` unless
    the caller needs to tell it from ``null``, as conditions do).
    """
    frames = scope.frames
    if source == "$item":
        if not frames:
            return absent
        value = frames[-1].item
    elif source == "$index":
        return frames[-1].index if frames else absent
    elif source == "$parent":
        level: Any = args.get("level", 1) if isinstance(args, Mapping) else 1
        if isinstance(level, bool) or not isinstance(level, numbers.Real):
            level = 1
        if math.isnan(level):
            return absent  # NaN: Math.max(1, NaN) is NaN, which names no frame
        level = max(1, level)
        if isinstance(level, float) or not isinstance(level, int):
            if not float(level).is_integer():
                return absent  # a fractional or infinite level names no frame
            level = int(level)
        if level >= len(frames):
            return absent
        value = frames[-1 - level].item
    elif source == "$globals":
        ctx = scope.ctx
        if not (isinstance(ctx, Mapping) and "globals" in ctx):
            return absent
        value = ctx["globals"]
    elif source == "$ctx":
        value = scope.ctx
    else:
        return absent
    path = args.get("path") if isinstance(args, Mapping) else None
    if isinstance(path, str) and path:
        found, value = lookup(value, parse_path(path))
        return value if found else absent
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


_LONE_SURROGATE: Final = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


def json_string(text: str) -> str:
    """``text`` as a JSON string literal, as ``JSON.stringify`` writes it: non-ASCII kept,
    a lone surrogate escaped (``"\\ud800"``)."""
    quoted = encode_basestring(text)
    return quoted if quoted.isascii() else _escape_lone_surrogates(quoted)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _escape_lone_surrogates(text: str) -> str:
    if _SURROGATE.search(text) is None:  # the usual case, found without the lookarounds
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_MAX_JSON_PIECES: Final = 1_000_000
"""Most pieces (brackets, commas, numbers, strings) one JSON text is built from: each holds a
character at least, and the list of them costs 8 bytes a piece."""


def _json_too_long() -> None:
    raise RenderLimitError(
        f"a value written as JSON holds more than MAX_OUTPUT_CHARS={MAX_OUTPUT_CHARS:,} characters "
        f"or {_MAX_JSON_PIECES:,} values (a list that repeats a long text or list?)",
        limit="MAX_OUTPUT_CHARS",
    )


class _TooDeep(Exception):
    """Raised inside :func:`to_json` for a value nested deeper than ``MAX_JSON_DEPTH``."""


def _encode(value: Any, out: list[str], active: set[int], size: list[int]) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, str):
        quoted = json_string(value)
        size[0] += len(quoted)
        if size[0] > MAX_OUTPUT_CHARS:
            _json_too_long()
        out.append(quoted)
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
        if len(active) > MAX_JSON_DEPTH:
            raise _TooDeep
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(json_string(_json_key(key)))
            out.append(":")
            _encode(item, out, active, size)
            if len(out) > _MAX_JSON_PIECES:
                _json_too_long()
        out.append("}")
        active.discard(marker)
    elif isinstance(value, (list, tuple)) or _is_sequence(value):
        marker = id(value)
        if marker in active:
            raise _Unencodable
        active.add(marker)
        if len(active) > MAX_JSON_DEPTH:
            raise _TooDeep
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out, active, size)
            if len(out) > _MAX_JSON_PIECES:
                _json_too_long()
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
        _encode(value, out, set(), [0])
    except _Unencodable:
        return ""
    except (_TooDeep, RecursionError):
        note(
            f"a value nested more than MAX_JSON_DEPTH={MAX_JSON_DEPTH} lists or mappings deep rendered empty"
        )
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


def from_text(value: Any) -> str:
    """The text of a non-``None`` value read by ``from`` (§9.1 step 2): strings as they are,
    anything else as JSON, so NaN and infinities give ``"null"`` (as ``JSON.stringify``
    writes them), also inside lists. A circular structure gives ``""``."""
    cls = value.__class__
    if cls is str:
        return value  # type: ignore[no-any-return]
    if cls is list or cls is dict or cls is tuple:
        return to_json(value)
    if cls is int:
        return int.__repr__(value)
    real = cls is float or (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral))
    if real and not math.isfinite(float(value)):
        return "null"
    return to_text(value)


# ---------------------------------------------------------------------------------------------
# Recursive expansion of data (reference rules only)

PLACEHOLDER: Final = re.compile(r"\{\{([^{}]+)}}")
"""The reference placeholder rule (§5.1): ``{{``, characters other than braces, ``}}``."""


def render_reference(text: str, scope: Scope, depth: int) -> str:
    """Render ``text`` (a string that came from *data*) with the reference rules only (§5.5).

    Every placeholder is a path, nothing else: no filters, operators, reserved names or
    ``{{#if}}`` blocks, so ``{{ x == 1 }}``, ``{{not a variable}}`` and ``{{$ctx}}`` are paths
    that do not resolve and render ``""``. A resolved string that holds ``{{`` is expanded
    again one level deeper. Data never reaches the extension language, and a path typed in
    data reaches scalars only: a mapping or list (``{{ctx}}``, ``{{globals}}``) renders ``""``
    with a warning, so data cannot print the context it is rendered in (difference 18). The
    result is counted as it grows and may not pass ``MAX_RENDER_CHARS``.
    """
    out: list[str] = []
    size = 0
    last = 0
    for match in PLACEHOLDER.finditer(text):
        start = match.start()
        path = match.group(1)
        value = lookup_scope(scope, parse_path(path.strip(JS_WHITESPACE)))
        cls = value.__class__
        if cls is str:
            piece = expand(value, scope, depth)
        elif value is None or cls is bool or cls is int or cls is float or isinstance(value, numbers.Real):
            piece = to_text(value)
        else:
            if isinstance(value, (Mapping, list, tuple)) or _is_sequence(value):
                shown = path if len(path) <= 60 else path[:57] + "..."
                note(
                    f"a placeholder in data, {{{{{shown}}}}}, reached a mapping or list and rendered "
                    "empty: data expands to strings, numbers and booleans only"
                )
            piece = ""
        size += start - last + len(piece)
        if size > MAX_RENDER_CHARS:
            check_output_size(size)
        out.append(text[last:start])
        out.append(piece)
        last = match.end()
    out.append(text[last:])
    return "".join(out)


EXPANDS: Final = "{{"
"""What a string read from data holds when it is expanded (:func:`expands`)."""


def expands(text: str) -> bool:
    """Whether a string read from data is expanded when rendered (§5.5): it holds ``{{``.
    A string that does not renders as it is."""
    return EXPANDS in text


def expand(text: str, scope: Scope, depth: int) -> str:
    """A string read from data as rendered against ``scope`` (§5.5): itself unless it
    :func:`expands`.

    ``depth`` is the depth of the template the string was read in; the string renders as a
    template of depth ``depth + 1`` and one deeper than ``MAX_EXPANSION_DEPTH`` is kept as it
    is, as is every string when the render's ``data_expansion`` is ``off``. The result can
    be at most ``MAX_RENDER_CHARS`` long.
    """
    if not expands(text) or depth >= MAX_EXPANSION_DEPTH or not _NOTES.expand:
        return text
    result = render_reference(text, scope, depth + 1)
    check_output_size(len(result))
    return result


# ---------------------------------------------------------------------------------------------
# Truth, numbers, equality


def is_real_number(value: Any) -> bool:
    """True for ints and floats that are not NaN; booleans are not numbers here (§7)."""
    cls = value.__class__
    if cls is int:
        return True
    if cls is float:
        return not math.isnan(value)
    if cls in _MEMBERLESS or isinstance(value, bool):  # str, bool, None
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
