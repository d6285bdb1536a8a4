"""Leaf interpolation compiled to generated Python functions.

Takes: a compiled leaf (:class:`~storyforge.engine.nodes.Leaf`). Gives: :func:`generate_leaf`,
a :class:`GeneratedLeaf` for leaves made only of text and ``{{item}}``, ``{{item.key}}`` or
``{{key}}`` placeholders (the shape :func:`storyforge.engine.assembler.simple_leaf` serves
with closures), else ``None``. Call it as ``fn(item, ctx)``: ``(text, contentful)``, or
``None`` when a value needs the general rules (a missing key, a float, a list, a string that
could expand, an oversized result) and the caller renders the leaf itself. Its
``source`` attribute is the generated Python text, for reading and debugging.

Why: the closure shortcut walks a tuple of pieces and tests each piece's kind on every
render; the generated function is one straight line per placeholder and one concatenation,
which is what Jinja2 does with its templates.

Safety: template text never reaches the generated source. Every literal piece and every
key is a constant in a table, bound to a name the generator makes up (``c0``, ``c1``, …);
the source holds only those names, the fixed helper names below and Python keywords, and is
compiled with ``compile()`` and run with ``exec()`` over a namespace built here (no
builtins). The source has no string literal at all (``tests/test_codegen.py`` checks it).

:data:`ENABLED` switches generation off (``False``): :func:`simple_leaf` then builds the
closures, which is how the tests compare both paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from functools import lru_cache
from types import CodeType
from typing import Any, Protocol, cast

from storyforge.engine.nodes import Output, Path, Text
from storyforge.engine.runtime import JS_WHITESPACE, MAX_RENDER_CHARS

__all__ = [
    "ENABLED",
    "GeneratedLeaf",
    "comment_text",
    "generate_leaf",
    "hole_of",
    "leaf_pieces",
    "template_source",
]

ENABLED = True
"""Whether :func:`storyforge.engine.assembler.simple_leaf` generates code (read at compile time)."""

MAX_HOLES = 64
"""Placeholders beyond which a leaf is served by the closures, not by generated code (here or
inlined in a generated program): Python's compiler takes superlinear time on one very long
function, so a pasted string with thousands of placeholders would stall compilation, while
the closures stay linear. Leaves written by hand hold a few."""

# The helpers every generated function may use, by the only names its source mentions.
_HELPERS: dict[str, Any] = {
    "_dict": dict,
    "_int": int,
    "_str": str,
    "_repr": int.__repr__,
    "_ws": JS_WHITESPACE,
    "_open": "{{",
    "_brace": "{",  # tested first: a one-character search is a memchr, several times faster
    "_max": MAX_RENDER_CHARS,
    "_None": None,
    "_KeyError": KeyError,
    "_empty": "",
}


class GeneratedLeaf(Protocol):
    """A leaf's interpolation as a generated function (a plain Python function, so a call
    costs nothing extra); ``source`` is its Python text and ``constants`` the values its
    names ``c0``, ``c1``, … stand for."""

    source: str
    constants: tuple[Any, ...]

    def __call__(self, item: Any, ctx: Any, /) -> tuple[str, bool] | None: ...


def hole_of(expr: Any, ctx_keys: bool = False) -> tuple[int, str] | None:
    """The hole ``(kind, key)`` a placeholder expression reads (see :func:`leaf_pieces`), or
    ``None`` for any other expression."""
    if not isinstance(expr, Path):
        return None
    segments = expr.segments
    if segments == ("item",):
        return (0, "")
    if len(segments) == 2 and segments[0] == "item":
        return (1, segments[1])
    if len(segments) == 1 and segments[0] not in ("ctx", "item"):
        return (2, segments[0])
    if ctx_keys and len(segments) == 2 and segments[0] == "ctx":
        return (3, segments[1])
    return None


def leaf_pieces(leaf: Any, ctx_keys: bool = False) -> list[str | tuple[int, str]] | None:
    """Text pieces and holes ``(kind, key)``: 0 ``{{item}}``, 1 ``{{item.key}}``, 2 ``{{key}}``,
    and with ``ctx_keys`` 3 ``{{ctx.key}}``; ``None`` for a leaf of another shape or with more
    than :data:`MAX_HOLES` placeholders."""
    parts = getattr(leaf, "parts", None)
    if leaf is None or not parts or not leaf.has_variables:
        return None
    if len(parts) > 2 * MAX_HOLES + 1:  # text and placeholders alternate
        return None
    pieces: list[str | tuple[int, str]] = []
    for part in parts:
        if isinstance(part, Text):
            pieces.append(part.value)
            continue
        hole = hole_of(part.expr, ctx_keys) if isinstance(part, Output) else None
        if hole is None:
            return None
        pieces.append(hole)
    if sum(1 for piece in pieces if isinstance(piece, tuple)) > MAX_HOLES:
        return None
    return pieces


@lru_cache(maxsize=1024)
def _code(source: str) -> CodeType:
    """The compiled code of a generated source. The source depends only on the leaf's shape
    (the constants are bound by name), so leaves of the same shape share one code object."""
    return compile(source, "<storyforge generated leaf>", "exec")


_GENERATED: dict[tuple[type, str], GeneratedLeaf | None] = {}
_GENERATED_SIZE = 4096


def generate_leaf(leaf: Any) -> GeneratedLeaf | None:
    """The leaf as a generated function, or ``None`` when it is not of the served shape.

    The function depends only on the leaf's text (a leaf is the parse of its text), and it
    keeps no state, so leaves with the same text share one: a store of templates built from
    the same snippets generates each once (up to 4,096 texts are kept, then all are dropped)."""
    text = getattr(leaf, "source", None)
    if text.__class__ is not str:
        return _generate_leaf(leaf)
    key = (leaf.__class__, text)
    try:
        return _GENERATED[key]
    except KeyError:
        pass
    generated = _generate_leaf(leaf)
    if len(_GENERATED) >= _GENERATED_SIZE:
        _GENERATED.clear()
    _GENERATED[key] = generated
    return generated


def _generate_leaf(leaf: Any) -> GeneratedLeaf | None:
    pieces = leaf_pieces(leaf)
    if pieces is None:
        return None
    constants: list[Any] = []

    def const(value: Any) -> str:
        constants.append(value)
        return f"c{len(constants) - 1}"

    lines = ["def leaf(item, ctx):"]
    terms: list[str] = []
    texts: list[str] = []
    reads: list[str] = []
    for source in ("item", "ctx"):
        if any(isinstance(p, tuple) and p[0] == (1 if source == "item" else 2) for p in pieces):
            reads += [f"    if {source}.__class__ is not _dict:", "        return _None"]
    lines += reads
    lines.append("    try:")  # a missing key: the general rules (zero cost when nothing is raised)
    for piece in pieces:
        if isinstance(piece, str):
            if piece:
                terms.append(const(piece))
            continue
        kind, key = piece
        n = len(texts)
        value, text = f"v{n}", f"t{n}"
        if kind == 0:
            lines.append(f"        {value} = item")
        else:
            lines.append(f"        {value} = {'item' if kind == 1 else 'ctx'}[{const(key)}]")
        terms.append(text)
        texts.append(text)
    lines += ["    except _KeyError:", "        return _None"]
    for n, text in enumerate(texts):
        value = f"v{n}"
        lines += [
            f"    cls = {value}.__class__",
            "    if cls is _str:",
            f"        if _brace in {value} and _open in {value}:",
            "            return _None",
            f"        {text} = {value}",
            "    elif cls is _int:",
            f"        {text} = _repr({value})",
            f"    elif {value} is _None:",
            f"        {text} = _empty",
            "    else:",
            "        return _None",
        ]
    # One BUILD_STRING of generated names: an f-string whose only parts are {c0}, {t0}, ...
    joined = 'f"' + "".join("{" + t + "}" for t in terms) + '"'
    contentful = " or ".join(f"{t}.strip(_ws)" for t in texts)
    lines += [
        f"    text = {joined}",
        "    if len(text) > _max:",
        "        return _None",
        f"    return text, not not ({contentful})",
    ]
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = {"__builtins__": {"len": len}, **_HELPERS}
    namespace.update({f"c{i}": value for i, value in enumerate(constants)})
    exec(_code(source), namespace)  # noqa: S102 - our own source, no template text in it
    fn = namespace.pop("leaf")  # the namespace (its globals) must not hold it: no cycle
    fn.source = source
    fn.constants = tuple(constants)
    return cast(GeneratedLeaf, fn)


def comment_text(text: str) -> str:
    """``text`` safe to show after ``#``: every character that is not printable (a line break
    of any kind among them) is written as its escape, so the comment cannot end early."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def template_source(template: Any) -> str:
    """The generated source of every leaf of a template model that has one, each headed by a
    comment naming the leaf's template path and listing its constants (for reading only:
    this text is never compiled; the functions the renderer runs have exactly these bodies,
    since generation is deterministic)."""
    out: list[str] = []
    seen: set[int] = set()
    stack: list[Any] = [template]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, tuple | list):
            stack.extend(reversed(node))
            continue
        if isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
            continue
        if not is_dataclass(node) or isinstance(node, type):
            continue
        leaf = getattr(node, "leaf", None)
        generated = generate_leaf(leaf) if leaf is not None else None
        if generated is not None:
            shown = ", ".join(f"c{i}={c!r}" for i, c in enumerate(generated.constants))
            out.append(f"# {comment_text(str(getattr(node, 'path', '?')))}: {shown}\n{generated.source}")
        stack.extend(reversed([getattr(node, f.name) for f in fields(node) if f.name != "leaf"]))
    return "\n".join(out)
