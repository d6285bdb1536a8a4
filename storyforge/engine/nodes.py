"""Frozen AST of the template language, and the compiled :class:`Leaf` / :class:`Condition`.

Takes: nothing (the parser and :mod:`storyforge.engine.conditions` build these nodes). Gives:

* expression nodes: :class:`Literal`, :class:`ListExpr`, :class:`DictExpr`, :class:`Path`,
  :class:`Reserved`, :class:`Ref`, :class:`Not`, :class:`Neg`, :class:`BoolOp`,
  :class:`Compare`, :class:`Arith`, :class:`Call`, :class:`Pipe` (with :class:`Filter`);
* leaf parts: :class:`Text`, :class:`Output`, :class:`IfBlock`;
* the compiled units :class:`Leaf` (a leaf string) and :class:`Condition` (a ``when:``), each
  holding its AST and one closure built once at compile time;
* :func:`freeze` (deep-freeze JSON-like data into hashable values) and :func:`unparse`.

Why it exists: structured JSON conditions and string expressions compile to the *same* node
types, so the linter, the trace and the interpreter see one language. Every node is a frozen,
hashable dataclass whose ``span`` (position in the source string) is left out of equality, so
tests can compare ASTs without positions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from storyforge.engine.frozen import FrozenDict

if TYPE_CHECKING:
    from storyforge.engine.runtime import Scope

__all__ = [
    "Arith",
    "BoolOp",
    "Call",
    "Compare",
    "Condition",
    "DictExpr",
    "Expr",
    "Filter",
    "FrozenDict",
    "IfBlock",
    "Leaf",
    "ListExpr",
    "Literal",
    "Neg",
    "Not",
    "Output",
    "Part",
    "Path",
    "Pipe",
    "Ref",
    "Reserved",
    "Resolver",
    "Span",
    "Text",
    "freeze",
    "iter_nodes",
    "typed_key",
    "unparse",
]

Resolver: TypeAlias = Callable[[str, Any], Any]
"""``resolve(source_name, args) -> value | None``, supplied by the renderer for DataRefs."""


@dataclass(frozen=True, slots=True)
class Span:
    """Where a node sits in its source string: 0-based offsets, 1-based line and column."""

    start: int
    end: int
    line: int
    column: int


def freeze(value: Any) -> Any:
    """A deep, hashable copy of JSON-like data: mappings -> :class:`FrozenDict`, lists -> tuples.

    Keys become strings. Scalars are kept; other objects are kept as they are (they are
    opaque to templates anyway).
    """
    cls = value.__class__
    if cls is str or cls is int or cls is bool or cls is float or value is None:
        return value  # the common case, without the abstract-class checks below
    if isinstance(value, Mapping):
        return FrozenDict({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


# --------------------------------------------------------------------------------------------
# Expressions


def typed_key(value: Any) -> Any:
    """A hashable image of frozen data that keeps types apart: ``True``, ``1`` and ``1.0``
    give different keys (plain ``==`` treats them as equal)."""
    cls = value.__class__
    if cls is str or cls is int or cls is bool or cls is float or value is None:
        return (cls.__name__, value)
    if isinstance(value, Mapping):
        return ("map", tuple((k, typed_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(typed_key(v) for v in value))
    return (type(value).__name__, value)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Literal:
    """A constant: string, number, boolean, ``None``, or frozen JSON data (structured ``value``).

    Equality is type-aware (``Literal(value=True) != Literal(value=1)``), so two conditions
    that compare against different constants never compare or hash equal.
    """

    value: Any
    span: Span | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Literal):
            return NotImplemented
        return bool(typed_key(self.value) == typed_key(other.value))

    def __hash__(self) -> int:
        return hash(typed_key(self.value))


@dataclass(frozen=True, slots=True, kw_only=True)
class ListExpr:
    """``[a, b, c]``."""

    items: tuple[Expr, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class DictExpr:
    """``{"limit": 3}`` (conditions only: a leaf placeholder cannot contain braces)."""

    items: tuple[tuple[str, Expr], ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Path:
    """A scope path (``turns[0].text``): leaf resolution rules, including the globals fallback."""

    segments: tuple[str, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reserved:
    """A reserved name with an optional path: ``$item.name``, ``$index``, ``$parent.title``."""

    name: str
    segments: tuple[str, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ref:
    """A DataRef, read through the renderer's ``resolve`` exactly once per evaluation."""

    source: str
    args: Any = None
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Not:
    """``not x``."""

    operand: Expr
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Neg:
    """``-x``."""

    operand: Expr
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class BoolOp:
    """``a and b and c`` / ``a or b``: short-circuit, the value of the deciding operand."""

    op: str
    operands: tuple[Expr, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Compare:
    """``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``not in`` (structured eq/neq/gt/lt too)."""

    op: str
    left: Expr
    right: Expr
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Arith:
    """``a + b - c``: ``first`` then ``(op, operand)`` pairs, left to right."""

    first: Expr
    rest: tuple[tuple[str, Expr], ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """``len(x)``, ``exists(x)``, ``nonEmpty(x)`` (structured exists/nonEmpty too)."""

    name: str
    args: tuple[Expr, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Filter:
    """One ``| name(args)`` stage of a pipeline."""

    name: str
    args: tuple[Expr, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipe:
    """``value | f | g(x)``: filters apply left to right to the whole expression on their left."""

    value: Expr
    filters: tuple[Filter, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


Expr: TypeAlias = (
    Literal | ListExpr | DictExpr | Path | Reserved | Ref | Not | Neg | BoolOp | Compare | Arith | Call | Pipe
)


# --------------------------------------------------------------------------------------------
# Leaf parts


@dataclass(frozen=True, slots=True, kw_only=True)
class Text:
    """Literal text between placeholders (unmatched braces included)."""

    value: str
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """A ``{{ … }}`` placeholder whose value is rendered; ``plain`` marks a reference path."""

    expr: Expr
    plain: bool = False
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class IfBlock:
    """``{{#if test}}then{{else}}otherwise{{/if}}``; ``otherwise`` is ``None`` without ``{{else}}``."""

    test: Expr
    then: tuple[Part, ...]
    otherwise: tuple[Part, ...] | None = None
    span: Span | None = field(default=None, compare=False, repr=False)


Part: TypeAlias = Text | Output | IfBlock


def _unset_render(scope: Scope, depth: int = 0) -> tuple[str, bool]:
    raise TypeError("Leaf built without a render function; use storyforge.engine.parser.compile_leaf")


def _unset_evaluate(scope: Scope, resolve: Resolver) -> bool:
    raise TypeError("Condition built without an evaluator; use storyforge.engine.parser.compile_condition")


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    """A compiled leaf string.

    ``render(scope) -> (text, contentful)``: ``contentful`` is true when at least one
    placeholder produced non-whitespace text (§5.5). The closure is built once and holds no
    per-render state, so one Leaf may be rendered from many threads at once.
    """

    source: str
    parts: tuple[Part, ...]
    has_variables: bool
    render: Callable[..., tuple[str, bool]] = field(default=_unset_render, compare=False, repr=False)

    def paths(self) -> tuple[tuple[str, ...], ...]:
        """Every scope path the leaf reads, in order of appearance (for linting)."""
        return tuple(node.segments for node in iter_nodes(self.parts) if isinstance(node, Path))


@dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """A compiled ``when:`` condition (structured mapping or string expression).

    ``evaluate(scope, resolve) -> bool``; ``resolve(source, args)`` reads DataRefs.
    ``source`` is the original spec (a string or a frozen mapping) for traces.
    """

    source: Any
    expr: Expr
    evaluate: Callable[[Scope, Resolver], bool] = field(default=_unset_evaluate, compare=False, repr=False)

    def refs(self) -> tuple[tuple[str, Any], ...]:
        """``(source, args)`` of every DataRef the condition reads, in order (for linting)."""
        return tuple((node.source, node.args) for node in iter_nodes((self.expr,)) if isinstance(node, Ref))


def _children(node: Any) -> tuple[Any, ...]:
    if isinstance(node, (Not, Neg)):
        return (node.operand,)
    if isinstance(node, BoolOp):
        return node.operands
    if isinstance(node, Compare):
        return (node.left, node.right)
    if isinstance(node, Arith):
        return (node.first, *(operand for _, operand in node.rest))
    if isinstance(node, (Call, Filter)):
        return node.args
    if isinstance(node, Pipe):
        return (node.value, *node.filters)
    if isinstance(node, ListExpr):
        return node.items
    if isinstance(node, DictExpr):
        return tuple(value for _, value in node.items)
    if isinstance(node, Output):
        return (node.expr,)
    if isinstance(node, IfBlock):
        return (node.test, *node.then, *(node.otherwise or ()))
    return ()


def iter_nodes(roots: tuple[Any, ...]) -> Iterator[Any]:
    """Every node under ``roots``, depth first, left to right (iterative: no recursion limit)."""
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(_children(node)))


# --------------------------------------------------------------------------------------------
# Unparser: AST -> canonical source text (parse(unparse(n)) == n)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEGMENT = re.compile(r"[A-Za-z0-9_]+\Z")
_KEYWORDS = frozenset({"and", "or", "not", "in", "true", "false", "null", "else"})
_PRECEDENCE = {"or": 1, "and": 2, "not": 3, "compare": 4, "arith": 5, "neg": 6, "atom": 7}


def _quote(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ch in "{}" or ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _segments(segments: tuple[str, ...]) -> str:
    out = []
    for segment in segments:
        if _SEGMENT.match(segment):
            out.append("." + segment)
        else:
            out.append("[" + _quote(segment) + "]")
    return "".join(out)


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_quote(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise ValueError(f"cannot write {type(value).__name__} as a literal")


def _level(node: Expr) -> int:
    if isinstance(node, BoolOp):
        return _PRECEDENCE[node.op]
    if isinstance(node, Not):
        return _PRECEDENCE["not"]
    if isinstance(node, Compare):
        return _PRECEDENCE["compare"]
    if isinstance(node, Arith):
        return _PRECEDENCE["arith"]
    if isinstance(node, Neg):
        return _PRECEDENCE["neg"]
    if isinstance(node, Pipe):
        return 0
    if (
        isinstance(node, Literal)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return _PRECEDENCE["neg"] if node.value < 0 or str(node.value)[0] == "-" else _PRECEDENCE["atom"]
    return _PRECEDENCE["atom"]


def _wrap(node: Expr, minimum: int) -> str:
    text = unparse(node)
    return f"({text})" if _level(node) < minimum else text


def unparse(node: Expr) -> str:
    """Canonical expression source for ``node``; parsing it gives an equal node.

    Written for expressions (string conditions and extension placeholders); a
    :class:`Ref` is written as ``source("name", args)``.
    """
    if isinstance(node, Literal):
        return _literal(node.value)
    if isinstance(node, ListExpr):
        return "[" + ", ".join(unparse(item) for item in node.items) + "]"
    if isinstance(node, DictExpr):
        return "{" + ", ".join(f"{_quote(k)}: {unparse(v)}" for k, v in node.items) + "}"
    if isinstance(node, Path):
        head, rest = node.segments[0], node.segments[1:]
        first = head if _NAME.match(head) and head not in _KEYWORDS else None
        if first is None:
            raise ValueError(f"path {node.segments!r} does not start with a name")
        return first + _segments(rest)
    if isinstance(node, Reserved):
        return node.name + _segments(node.segments)
    if isinstance(node, Ref):
        if node.args is None:
            return f"source({_quote(node.source)})"
        return f"source({_quote(node.source)}, {_literal(node.args)})"
    if isinstance(node, Not):
        return "not " + _wrap(node.operand, _PRECEDENCE["not"])
    if isinstance(node, Neg):
        return "-" + _wrap(node.operand, _PRECEDENCE["atom"])
    if isinstance(node, BoolOp):
        level = _PRECEDENCE[node.op]
        return f" {node.op} ".join(_wrap(operand, level + 1) for operand in node.operands)
    if isinstance(node, Compare):
        level = _PRECEDENCE["arith"]
        return f"{_wrap(node.left, level)} {node.op} {_wrap(node.right, level)}"
    if isinstance(node, Arith):
        level = _PRECEDENCE["neg"]
        text = _wrap(node.first, level)
        for op, operand in node.rest:
            text += f" {op} {_wrap(operand, level)}"
        return text
    if isinstance(node, Call):
        return f"{node.name}({', '.join(unparse(arg) for arg in node.args)})"
    if isinstance(node, Pipe):
        text = _wrap(node.value, 1)
        for stage in node.filters:
            text += f" | {stage.name}"
            if stage.args:
                text += f"({', '.join(unparse(arg) for arg in stage.args)})"
        return text
    raise TypeError(f"not an expression node: {node!r}")
