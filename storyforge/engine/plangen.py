"""A whole template compiled to one generated Python function.

Takes: the frozen template model (:mod:`storyforge.engine.model`). Gives:
:func:`generate_program`, a :class:`GeneratedProgram` that fills every slot and assembles and
squashes the layout in one call, ``program(ctx, handlers, estimate[, gmax]) -> RenderResult``:
one for renders with no global budget (which counts tokens only under a slot's or node's
``maxTokens``, as the closures do), one for renders with a global budget counted with the
default estimator; ``None`` for a template too large or too deep to generate. Its ``source``
attribute is the generated Python text and ``constants`` the values its names ``c0``, ``c1``,
… stand for, for reading and debugging.

Why: with nothing to count, a render is string building: look up each source, loop over its
items, fill each leaf, join the messages. The closures of :mod:`storyforge.engine.renderer` take
every decision that does not depend on the data once per template, but a render still walks
one closure per node and builds the trace's tuples, the message tuples and the squash at run
time. Here every node is a few straight lines in one function: plan nodes and layout steps
are inlined in fill order, a leaf of text and ``{{item}}``, ``{{item.key}}`` or ``{{key}}``
placeholders is one f-string, trace events that do not depend on the data are prebuilt
tuples, and when every message of the template has the same role and none is prefilled, the
squash is decided now (one ``"\\n".join``). Token counts, where a budget needs them, are
inline arithmetic under the default estimator; a render counting with another estimator
takes the closures.

The generated function does exactly what the closures do, event for event (the trace is the
same) and warning for warning; ``tests/test_plangen.py`` renders random templates and data
both ways.

Safety: template text never reaches the generated source. Every literal, source name, key,
path and argument is a constant in a table, bound to a name made up here (``c0``, ``c1``, …);
the source holds only those names, the fixed helper names below and Python keywords, and
runs over a namespace built here with no builtins.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

from storyforge.engine.budget import default_estimator
from storyforge.engine.codegen import MAX_HOLES, hole_of, leaf_pieces
from storyforge.engine.errors import RenderLimitError
from storyforge.engine.model import (
    DataRef,
    ForEachNode,
    IfNode,
    LayoutMessage,
    LayoutSlot,
    MessageBlock,
    MessageNode,
    PlanNode,
    Template,
    static_text,
)
from storyforge.engine.nodes import IfBlock, Output, Path, Pipe, Text
from storyforge.engine.renderer import FAILED, RenderResult, build_test, item_keys, limit_at, order_items
from storyforge.engine.runtime import (
    JS_WHITESPACE,
    MAX_OUTPUT_CHARS,
    MAX_RENDER_CHARS,
    MAX_RENDER_ITEMS,
    Frame,
    Scope,
    compare_numbers,
    deep_equal,
    is_real_number,
    js_trim,
    non_empty,
    parse_path,
    resolve_reserved,
    too_many_items,
    too_much_output,
    truthy,
)
from storyforge.engine.sources import MISSING, RESERVED_SOURCES
from storyforge.engine.state import RenderState, dropped_warning, text_from_value, unresolvable_warning
from storyforge.engine.trace import CUT, END, RESUME, RUN, SlotInfo

__all__ = ["ENABLED", "GeneratedProgram", "generate_program"]

ENABLED = True
"""Whether compiled templates get generated programs (read by ``compile_template``); ``False``
makes every render run the closures, which is how the tests compare both."""

MAX_INLINE_KEYS = 4
"""Keys of a reserved ref's path (``$item``, ``$ctx``) a generated program walks inline; a
longer path resolves through the runtime's function."""

MAX_LINES = 5000
"""Generated lines beyond which a template keeps the closures: compiling a function costs
Python's compiler about 25 µs a line, and more than linearly for very long ones, so a
template of hundreds of messages (about 20 lines each) would make its first render wait,
which a page that compiles on every keystroke cannot afford. Typical templates take a few
hundred lines."""


def _placed(exc: RenderLimitError, path: Any) -> None:
    """Raise a leaf's limit error at the node ``path``."""
    raise exc.at(path) from None


# The helpers every generated program may use, by the only names its source mentions.
_HELPERS: dict[str, Any] = {
    "_dict": dict,
    "_list": list,
    "_tuple": tuple,
    "_int": int,
    "_str": str,
    "_float": float,
    "_bool": bool,
    "_globals": "globals",
    "_None": None,
    "_True": True,
    "_False": False,
    "_repr": int.__repr__,
    "_len": len,
    "_enumerate": enumerate,
    "_reversed": reversed,
    "_isinstance": isinstance,
    "_Exception": Exception,
    "_KeyError": KeyError,
    "_Scope": Scope,
    "_Frame": Frame,
    "_tuple_new": tuple.__new__,
    "_FAILED": FAILED,
    "_MISSING": MISSING,
    "_reserved": resolve_reserved,
    "_order": order_items,
    "_non_empty": non_empty,
    "_truthy": truthy,
    "_deep_equal": deep_equal,
    "_plain": None,  # set below
    "_item_scope": None,  # set below
    "_scalars": frozenset({str, int, float, bool, type(None)}),
    "_compare_numbers": compare_numbers,
    "_ws": JS_WHITESPACE,
    "_open": "{{",
    "_brace": "{",  # tested first: a one-character search is a memchr, several times faster
    "_nl": "\n",
    "_empty": "",
    "_max": MAX_RENDER_CHARS,
    "_max_out": MAX_OUTPUT_CHARS,
    "_max_items": MAX_RENDER_ITEMS,
    "_too_long": too_much_output,
    "_too_many": too_many_items,
    "_limit_at": limit_at,
    "_LimitError": RenderLimitError,
    "_placed": _placed,
    "_merge_onto": None,  # set below
    "_dropped": dropped_warning,
    "_passed_note": None,  # set below
    "_utf16": "utf-16-le",
    "_sp": "surrogatepass",
    "_Result": RenderResult,
    "_new": object.__new__,
    "_State": RenderState,
    "_unresolvable": unresolvable_warning,
    "_text_from": text_from_value,
    "_range": range,
    "_forEach": "forEach",
    "_if": "if",
    "_then": "then",
    "_else": "else",
    "_reason_empty": "empty",
    "_reason_error": "resolver_error",
    "_reason_not_list": "not_a_list",
    "_run": RUN,
    "_cut": CUT,
    "_resume": RESUME,
    "_end": END,
}


class GeneratedProgram(Protocol):
    """A template's no-budget render as one generated function:
    ``program(ctx, handlers, estimate) -> RenderResult``."""

    source: str
    constants: tuple[Any, ...]
    counts: bool
    """Whether a render with no budget counts tokens (the template sets a ``maxTokens``)."""

    def __call__(self, ctx: Any, handlers: Any, estimate: Any, /) -> RenderResult: ...


def _budgeted(template: Template) -> bool:
    """Whether any slot or plan node of the template sets ``maxTokens``."""
    for slot in template.slots.values():
        if slot.budget is not None and slot.budget.max_tokens is not None:
            return True
        if _plan_budgeted(slot.plan):
            return True
    return False


def _plan_budgeted(plan: tuple[PlanNode, ...]) -> bool:
    """Whether any node of ``plan`` (nested ones too) sets ``maxTokens``."""
    for node in plan:
        budget = getattr(node, "budget", None)
        if budget is not None and budget.max_tokens is not None:
            return True
        if isinstance(node, ForEachNode) and _plan_budgeted(node.map):
            return True
        if isinstance(node, IfNode) and (_plan_budgeted(node.then) or _plan_budgeted(node.else_)):
            return True
    return False


def _plan_roles(nodes: tuple[PlanNode, ...]) -> set[tuple[str, bool]]:
    """Every ``(role, prefix)`` a plan can emit."""
    found: set[tuple[str, bool]] = set()
    for node in nodes:
        if isinstance(node, MessageNode):
            found.add((node.role, node.prefix))
        elif isinstance(node, ForEachNode):
            found |= _plan_roles(node.map)
            if node.interleave is not None and node.interleave.leaf is not None:
                found.add(("user", False))
        elif isinstance(node, IfNode):
            found |= _plan_roles(node.then) | _plan_roles(node.else_)
    return found


def _roles(template: Template) -> set[tuple[str, bool]]:
    """Every ``(role, prefix)`` a render of the template can emit."""
    found: set[tuple[str, bool]] = set()
    for node in template.layout:
        if isinstance(node, LayoutSlot):
            for block in (*node.header, *node.footer):
                found.add((block.role, block.prefix))
        else:
            found.add((node.role, node.prefix))
    for slot in template.slots.values():
        found |= _plan_roles(slot.plan)
    return found


class _TooLong(Exception):
    """The program would pass :data:`MAX_LINES`: the template keeps the closures."""


@dataclass(slots=True)
class _Writer:
    """Lines of generated source, its constant table and fresh variable names."""

    lines: list[str]
    constants: list[Any]
    by_value: dict[Any, str]
    counter: int = 0
    texts_only: bool = False
    budgeted: bool = False
    """Whether the code being written counts tokens: everywhere in a program for renders with
    a global budget; in one for renders with none, only under a slot's or node's ``maxTokens``."""
    gmax: bool = False
    """Whether the render has a global budget (``gmax`` and ``consumed`` exist)."""
    needs_state: bool = False
    bounded: bool = False
    """Whether no render can come near ``MAX_OUTPUT_CHARS`` (:func:`_most_counted`): the
    program counts no characters, as no count could reach the limit."""
    last: frozenset[str | None] = frozenset((None,))
    """The roles the last message of ``out`` may have at the line being written (``None``:
    ``out`` may be empty). ``out`` holds finished messages and ``cur`` the last of them; a
    message of a role that is surely not the last one's is appended, one of the last one's
    role is joined to it (what squashing does), and only where either may happen is the last
    one's role read."""
    pending: bool = False
    """Whether a text may have been joined to ``cur`` above the line being written: a join
    puts its texts in ``pend`` (``None`` until then), which are joined into ``cur``'s content
    once (:meth:`settled`) when the next message starts or the messages are read, rather than
    copying the content so far at every join."""

    def settled(self) -> list[str]:
        """Lines writing ``cur``'s joined texts into its content (none where nothing was joined)."""
        if not self.pending:
            return []
        content = self.const("content")
        return ["if pend is not _None:", f"    cur[{content}] = _nl.join(pend)", "    pend = _None"]

    def const(self, value: Any) -> str:
        """The name of a constant holding ``value`` (equal hashable values share one name)."""
        key: Any
        try:
            key = (value.__class__, value)
            hash(key)
        except TypeError:
            key = ("id", id(value))
        name = self.by_value.get(key)
        if name is None:
            self.constants.append(value)
            name = f"c{len(self.constants) - 1}"
            self.by_value[key] = name
        return name

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def add(self, depth: int, *lines: str) -> None:
        pad = "    " * depth
        self.lines.extend(pad + line for line in lines)
        if len(self.lines) > MAX_LINES:
            raise _TooLong

    def emitted(self, role: str, text: str, prefix: bool, texts: bool = False) -> str:
        """How an emitted message is written into a buffer: its text alone when every message
        of the template (or, ``texts``, of the buffer) has one role and one prefix, else
        ``(role, text, prefix)``."""
        if self.texts_only or texts:
            return text
        return f"({self.const(role)}, {text}, {'_True' if prefix else '_False'})"

    def put(self, role: str, text: str, prefix: bool) -> list[str]:
        """Lines putting a message of ``role`` and ``text`` (a name or a constant) onto
        ``out`` as squashing would (see :attr:`last`); the caller then sets :attr:`last`."""
        content, last = self.const("content"), self.last
        flag = f", {self.const('prefix')}: _True" if prefix else ""
        new = [
            *self.settled(),
            f"cur = {{{self.const('role')}: {self.const(role)}, {content}: {text}{flag}}}",
            "out.append(cur)",
        ]
        join = [
            "if pend is _None:",
            f"    pend = [cur[{content}], {text}]",
            "else:",
            f"    pend.append({text})",
        ]
        if prefix:
            join.append(f"cur[{self.const('prefix')}] = _True")
        if role not in last:
            return new
        self.pending = True
        if last == {role}:
            return join
        test = f"cur[{self.const('role')}] == {self.const(role)}"
        if None in last:
            test = f"cur is not _None and {test}"
        return [f"if {test}:", *("    " + line for line in join), "else:", *("    " + line for line in new)]


def _count(w: _Writer, size: str, path: Any) -> list[str]:
    """Lines adding ``size`` characters to what the render emitted (``MAX_OUTPUT_CHARS``);
    none in a program whose output is bounded well below it (:func:`_most_counted`)."""
    if w.bounded:
        return []
    limit = int(_HELPERS["_max_out"])  # a literal: cheaper than a global read per message
    return [f"if (chars := chars + {size}) > {limit}:", f"    _limit_at(_too_long, chars, {w.const(path)})"]


def _most_counted(template: Template) -> int | None:
    """The most characters a render of ``template`` can count (the closures' count of emitted
    text): a template with no loop and no ``from`` text emits each of its messages at most
    once, each a leaf render (at most ``MAX_RENDER_CHARS``) or its fixed text; ``None`` when
    a loop or a text from data makes it unbounded."""
    most: int | None = 0
    for node in template.layout:
        most = _most_of(most, (node,) if isinstance(node, LayoutMessage) else (*node.header, *node.footer))
    for slot in template.slots.values():
        most = _most_of(most, slot.plan)
    return most


def _most_of(most: int | None, nodes: tuple[Any, ...]) -> int | None:
    """``most`` plus the most characters ``nodes`` (blocks or plan nodes) can count."""
    for node in nodes:
        if most is None or isinstance(node, ForEachNode) or getattr(node, "from_", None) is not None:
            return None
        if isinstance(node, IfNode):
            most = _most_of(_most_of(most, node.then), node.else_)
            continue
        fixed = static_text(node.leaf)
        most += len(fixed) if fixed is not None else (int(_HELPERS["_max"]) if node.leaf is not None else 0)
    return most


def _visit(w: _Writer, path: Any, items: str) -> list[str]:
    """Lines counting forEach items visited (``MAX_RENDER_ITEMS``): with a budget one per
    item as it is visited (the walk may end early), else all of ``items`` before the loop
    (every item is visited), as the closures count them."""
    return [
        "visited += 1" if w.gmax else f"visited += _len({items})",
        f"if visited > {int(_HELPERS['_max_items'])}:",
        f"    _limit_at(_too_many, visited, {w.const(path)})",
    ]


def _render_call(w: _Writer, target: str, render: str, scope: str, path: Any) -> list[str]:
    """Lines calling a compiled leaf; a limit it hits is raised at the node ``path``."""
    return [
        "try:",
        f"    {target} = {render}({scope})",
        "except _LimitError as exc:",
        f"    _placed(exc, {w.const(path)})",
    ]


def _resolve(
    w: _Writer,
    depth: int,
    ref: Any,
    target: str,
    scope: str,
    for_condition: bool,
    item: str | None = None,
    index: str | None = None,
) -> None:
    """Lines that set ``target`` to the value of ``ref`` (see :meth:`RenderState.resolve`);
    ``item`` and ``index`` name the innermost loop's item and index where known (else they
    are read from ``scope``)."""
    source, args = w.const(ref.source), w.const(ref.args)
    item = item if item is not None and item != "_None" else f"{scope}.item"
    at_index = index if index is not None else f"{scope}.frames[-1].index"
    if ref.source in RESERVED_SOURCES:
        absent = "_MISSING" if for_condition else "_None"
        path = ref.args.get("path") if isinstance(ref.args, Mapping) else None
        plain = not (isinstance(path, str) and path)  # no path to walk from the value
        if ref.source in ("$item", "$index", "$parent") and scope == ROOT:
            w.add(depth, f"{target} = {absent}")  # outside any loop: no frame to read
        elif ref.source == "$ctx" and plain:
            w.add(depth, f"{target} = ctx")
        elif ref.source == "$item" and plain:
            w.add(depth, f"{target} = {item}")  # the innermost loop's item
        elif ref.source == "$index":  # its args are never read
            w.add(depth, f"{target} = {at_index}")
        elif ref.source in ("$item", "$ctx") and 0 < len(keys := parse_path(path)) <= MAX_INLINE_KEYS:
            # a path of plain keys walked inline through dicts, a key a dict does not hold
            # being absent; anything else (a list, a mapping of another class) resolves the
            # whole ref the general way
            # (a string, number, boolean or None has no members: the path is absent)
            general = (
                f"    {target} = {absent} if {target}.__class__ in _scalars "
                f"else _reserved({source}, {args}, {scope}, {absent})"
            )
            lines = [f"{target} = {'ctx' if ref.source == '$ctx' else item}"]
            test = f"if {target}.__class__ is not _dict:"
            for n, key in enumerate(keys):
                name = w.const(key)
                lines += [test, general, f"elif {name} not in {target}:", f"    {target} = {absent}"]
                if n < len(keys) - 1:
                    test = f"elif ({target} := {target}[{name}]).__class__ is not _dict:"
                else:
                    lines += ["else:", f"    {target} = {target}[{name}]"]
            w.add(depth, *lines)
        else:
            w.add(depth, f"{target} = _reserved({source}, {args}, {scope}, {absent})")
        return
    handler = w.fresh("h")
    absent = "_MISSING" if for_condition else "_None"
    w.add(
        depth,
        f"{handler} = handlers.get({source})",
        f"if {handler} is _None:",
        f"    {target} = {absent}",
        "else:",
        "    try:",
        f"        {target} = {handler}(ctx, {args})",
        "    except _Exception as exc:",
        f"        warnings.append(_unresolvable(ctx, {w.const(ref.to_json())}, exc))",
        f"        {target} = {'_MISSING' if for_condition else '_FAILED'}",
    )
    # A handler saying "nothing" (MISSING) leaves the target MISSING; the two callers that
    # read values (a `from` message, a forEach) treat it as None, off their hot paths.


def _quick_leaf(w: _Writer, depth: int, leaf: Any, item: str, contentful: bool) -> bool:
    """Lines that set ``text`` (and ``contentful`` when asked) to the leaf filled inline, and
    ``size`` to its length, or ``text`` to ``None`` when a value needs the general rules; ``False`` (and no lines) when the leaf
    is not made of text and ``{{item}}``, ``{{item.key}}``, ``{{key}}``, ``{{ctx.key}}`` or
    ``{{key.inner}}`` placeholders (also piped through ``upper``, ``lower`` or ``trim``, and in
    ``{{#if}}`` blocks testing such a path: :func:`_quick_blocks`).

    Filled inline: strings without ``{{`` (which could expand), ints and ``None`` (also a
    path found nowhere, see ``_ABSENT``), as the leaf itself would render them; anything else
    is left to the compiled leaf.
    """
    pieces = leaf_pieces(leaf, ctx_keys=True)
    if pieces is None:
        blocks = _block_parts(leaf)
        if blocks is None:
            return False
        _quick_blocks(w, depth, blocks, item, contentful)
        return True
    inner = _start_fill(w, depth, any(isinstance(p, tuple) and p[0] >= 2 for p in pieces))
    values: list[tuple[str, str]] = []
    item_keys: list[tuple[str, str]] = []
    terms: list[str] = []
    for piece, value, text in _each_hole(w, pieces, terms):
        if piece[0] == 1:  # item keys are read together, after one look at the item
            item_keys.append((w.const(piece[1]), value))
        else:
            _read_hole(w, inner, piece, item, value)
        values.append((value, text))
    if item_keys:
        _item_keys(w, inner, item, item_keys)
    if len(values) == 1:
        literal = sum(len(p) for p in pieces if isinstance(p, str))
        _one_hole(w, inner, values[0][0], terms, values[0][1], contentful, literal)
        return True
    # every value a string without `{{` (the usual case): the f-string of the values, tested
    # at once; else each value made text on its own
    plain = " and ".join(f"{v}.__class__ is _str" for v, _ in values)
    plain += "".join(f" and (_brace not in {v} or _open not in {v})" for v, _ in values)
    ready = " and ".join(f"{t} is not _None" for _, t in values)
    for names, test, level in ((dict(values), f"if {plain}:", inner + 1), ({}, f"if {ready}:", inner + 2)):
        if names:
            w.add(inner, test)
        else:
            w.add(inner, "else:", *(f"    {_as_text(value, text)}" for value, text in values), f"    {test}")
        written = [{v: k for k, v in names.items()}.get(t, t) for t in terms]
        w.add(level, 'text = f"' + "".join("{" + t + "}" for t in written) + '"')
        if contentful:
            filled = " or ".join(f"{names and v or t}.strip(_ws)" for v, t in values)
            w.add(level, f"contentful = not not ({filled})")
        w.add(level, "size = _len(text)", "if size > _max:", "    text = _None")
    return True


def _each_hole(w: _Writer, pieces: Any, terms: list[str]) -> Iterator[tuple[Any, str, str]]:
    """The holes (and blocks) of ``pieces``, each with fresh names for its value and text;
    ``terms`` gets the f-string's terms in order (constants for the literal text)."""
    for piece in pieces:
        if isinstance(piece, str):
            if piece:
                terms.append(w.const(piece))
            continue
        value, text = w.fresh("v"), w.fresh("t")
        terms.append(text)
        yield piece, value, text


_ABSENT = "(_None if ctx.__class__ is _dict and _globals not in ctx else _MISSING)"
"""What a path found nowhere renders as: ``None``, unless ``ctx.globals`` could still hold it
(or ``ctx`` is not a dict): then :data:`MISSING`, and the leaf takes the general rules."""
_ABSENT_IN_DICT = "(_None if _globals not in ctx else _MISSING)"
""":data:`_ABSENT` where ``ctx`` is known to be a dict."""


def _start_fill(w: _Writer, depth: int, reads_ctx: bool) -> int:
    """The first lines of an inline fill (``text`` is ``None`` until filled; keys of ``ctx``
    are read only from a dict); returns the depth the fill goes on at."""
    w.add(depth, "text = _None")
    if not reads_ctx:
        return depth
    w.add(depth, "if ctx.__class__ is _dict:")
    return depth + 1


def _as_text(value: str, text: str) -> str:
    """The line setting ``text`` to ``value`` as a placeholder renders it, where that is
    plain (a string without ``{{``, an int, ``None``); else to ``None``."""
    return (
        f"{text} = {value} if {value}.__class__ is _str and (_brace not in {value} or _open not in {value}) else "
        f"(_repr({value}) if {value}.__class__ is _int else (_empty if {value} is _None else _None))"
    )


def _read_hole(w: _Writer, depth: int, hole: tuple[int, Any], item: str, value: str) -> None:
    """Lines setting ``value`` to what a hole of :func:`leaf_pieces` or :func:`_hole` reads
    (``_ABSENT`` when the path is found nowhere, :data:`MISSING` when the general rules must
    decide)."""
    kind, key = hole
    if kind == 4:  # {{key.inner}}: a key of a dict in ctx (ctx is a dict here: see _start_fill)
        outer, inner = key
        w.add(
            depth,
            "try:",
            f"    {value} = ctx[{w.const(outer)}]",
            "except _KeyError:",
            f"    {value} = {_ABSENT_IN_DICT}",
            "else:",
            f"    if {value}.__class__ is _dict:",
            "        try:",
            f"            {value} = {value}[{w.const(inner)}]",
            "        except _KeyError:",
            f"            {value} = {_ABSENT_IN_DICT}",
            "    else:",
            f"        {value} = _MISSING",
        )
    elif kind == 0:
        w.add(depth, f"{value} = {item}")
    elif kind == 1:
        _item_keys(w, depth, item, [(w.const(key), value)])
    else:  # {{key}}, or {{ctx.key}} unless ctx has a key "ctx" (then that is its root)
        # (ctx is a dict here: see _start_fill)
        read = [
            "try:",
            f"    {value} = ctx[{w.const(key)}]",
            "except _KeyError:",
            f"    {value} = {_ABSENT_IN_DICT}",
        ]
        if kind == 3:
            read = [
                f"if {w.const('ctx')} in ctx:",
                f"    {value} = _MISSING",
                "else:",
                *("    " + r for r in read),
            ]
        w.add(depth, *read)


@dataclass(frozen=True, slots=True)
class _Piped:
    """A placeholder ``{{ hole | f | g }}`` whose filters are all in :data:`_TEXT_FILTERS`."""

    hole: tuple[int, Any]
    filters: tuple[Any, ...]


_TEXT_FILTERS: dict[str, Any] = {"upper": str.upper, "lower": str.lower, "trim": js_trim}
"""Filters that map a text to a text (and ``None`` to ``None``) and never raise: the string
functions the filters apply (see :mod:`storyforge.engine.filters`)."""

Pieces = list[str | tuple[int, Any] | _Piped]
Block = tuple[tuple[int, Any], Pieces, Pieces]


def _hole(expr: Any) -> tuple[int, Any] | None:
    """A hole of :func:`leaf_pieces` (with ``{{ctx.key}}``), or ``(4, (key, inner))`` for
    ``{{key.inner}}`` read from ``ctx`` (``{{globals.title}}``, ``{{target.name}}``)."""
    hole = hole_of(expr, ctx_keys=True)
    if hole is None and isinstance(expr, Path):
        segments = expr.segments
        if len(segments) == 2 and segments[0] not in ("item", "ctx"):
            return (4, segments)
    return hole


def _piece(part: Any) -> str | tuple[int, Any] | _Piped | None:
    """Text, a hole (see :func:`leaf_pieces`) or a piped hole, or ``None`` for another part."""
    if isinstance(part, Text):
        return part.value
    if not isinstance(part, Output):
        return None
    expr = part.expr
    if isinstance(expr, Pipe):
        hole = _hole(expr.value)
        if hole is None or any(f.args or f.name not in _TEXT_FILTERS for f in expr.filters):
            return None
        return _Piped(hole, tuple(_TEXT_FILTERS[f.name] for f in expr.filters))
    return _hole(expr)


def _block_parts(leaf: Any) -> list[str | tuple[int, Any] | _Piped | Block] | None:
    """A leaf as text, holes (:func:`_hole`), piped holes and ``{{#if}}`` blocks ``(test,
    then, otherwise)`` whose test is a hole and whose branches hold only text and (piped)
    holes; ``None`` for a leaf of another shape or of text alone."""
    parts = getattr(leaf, "parts", None)
    if not parts or len(parts) > 2 * MAX_HOLES + 1:
        return None

    def pieces(branch: Any) -> Pieces | None:
        found: Pieces = []
        for part in branch:
            piece = _piece(part)
            if piece is None:
                return None
            found.append(piece)
        return found

    out: list[str | tuple[int, Any] | _Piped | Block] = []
    for part in parts:
        if isinstance(part, IfBlock):
            test = _hole(part.test)
            then, otherwise = pieces(part.then), pieces(part.otherwise or ())
            if (
                test is None
                or then is None
                or otherwise is None
                or len(then) + len(otherwise) > 2 * MAX_HOLES
            ):
                return None
            out.append((test, then, otherwise))
            continue
        found = pieces((part,))
        if found is None:
            return None
        out += found
    return None if all(isinstance(p, str) for p in out) else out


def _reads_ctx(piece: Any) -> bool:
    """Whether a piece of :func:`_block_parts` reads a key of ``ctx``."""
    if isinstance(piece, str):
        return False
    if isinstance(piece, _Piped):
        return _reads_ctx(piece.hole)
    if isinstance(piece[0], int):
        return bool(piece[0] >= 2)
    test, then, otherwise = piece
    return _reads_ctx(test) or any(_reads_ctx(p) for p in (*then, *otherwise))


def _quick_blocks(
    w: _Writer, depth: int, parts: list[str | tuple[int, Any] | _Piped | Block], item: str, contentful: bool
) -> None:
    """:func:`_quick_leaf` for a leaf of :func:`_block_parts` (``{{#if}}`` blocks, filters,
    two-key paths): each
    block's test read and judged (:func:`~storyforge.engine.runtime.truthy`), its taken
    branch filled into one text. A placeholder outside blocks counts as content when its
    text does; a taken branch when any of its text does (literal text too)."""
    inner = _start_fill(w, depth, any(_reads_ctx(p) for p in parts))
    terms, filled = _block_lines(w, inner, parts, item)
    joined = 'f"' + "".join("{" + t + "}" for t in terms) + '"'
    w.add(inner, f"if {' and '.join(f'{t} is not _None' for t in filled)}:", f"    text = {joined}")
    if contentful:
        w.add(inner + 1, f"contentful = not not ({' or '.join(f'{t}.strip(_ws)' for t in filled)})")
    w.add(inner + 1, "size = _len(text)", "if size > _max:", "    text = _None")


def _block_lines(w: _Writer, level: int, pieces: Any, item: str) -> tuple[list[str], list[str]]:
    """Lines filling ``pieces`` (for :func:`_quick_blocks`); returns the f-string's terms and
    the variables that hold the holes' and blocks' texts (``None``: the general rules decide)."""
    terms: list[str] = []
    filled: list[str] = []
    for piece, value, text in _each_hole(w, pieces, terms):
        if isinstance(piece, _Piped):
            _read_hole(w, level, piece.hole, item, value)
            applied = value
            for fn in piece.filters:
                applied = f"{w.const(fn)}({applied})"
            w.add(
                level,
                f"if {value}.__class__ is _int:",
                f"    {value} = _repr({value})",
                f"if {value}.__class__ is _str and (_brace not in {value} or _open not in {value}):",
                f"    {text} = {applied}",
                f"elif {value} is _None:",
                f"    {text} = _empty",
                "else:",
                f"    {text} = _None",
            )
        elif isinstance(piece[0], int):
            _read_hole(w, level, piece, item, value)
            w.add(level, _as_text(value, text))
        else:
            test, then, otherwise = piece
            _read_hole(w, level, test, item, value)
            w.add(level, f"if {value} is _MISSING:", f"    {text} = _None", f"elif _truthy({value}):")
            _block_branch(w, level + 1, then, text, item)
            w.add(level, "else:")
            _block_branch(w, level + 1, otherwise, text, item)
        filled.append(text)
    return terms, filled


def _block_branch(w: _Writer, level: int, pieces: Pieces, target: str, item: str) -> None:
    terms, filled = _block_lines(w, level, pieces, item)
    joined = 'f"' + "".join("{" + t + "}" for t in terms) + '"' if terms else "_empty"
    ready = " and ".join(f"{t} is not _None" for t in filled)
    w.add(level, f"{target} = {joined} if {ready} else _None" if ready else f"{target} = {joined}")


def _item_keys(w: _Writer, depth: int, item: str, reads: list[tuple[str, str]]) -> None:
    """Lines setting each ``value`` of ``reads`` (``(key, value)``) to what ``{{item.key}}``
    reads: the key of a dict item; for a key the item does not have, or an item with no keys
    (a string, number or ``None``), ``_ABSENT``; :data:`MISSING` (the general rules) for lists
    and other values."""
    if item == "_None":  # outside any loop
        w.add(depth, *(f"{value} = {_ABSENT}" for _, value in reads))
        return
    w.add(depth, f"if {item}.__class__ is _dict:")
    for key, value in reads:
        w.add(
            depth + 1, "try:", f"    {value} = {item}[{key}]", "except _KeyError:", f"    {value} = {_ABSENT}"
        )
    w.add(
        depth,
        f"elif {item} is _None or {item}.__class__ is _str or {item}.__class__ is _int "
        f"or {item}.__class__ is _float or {item}.__class__ is _bool:",
        *(f"    {value} = {_ABSENT}" for _, value in reads),
        "else:",
        *(f"    {value} = _MISSING" for _, value in reads),
    )


def _one_hole(
    w: _Writer, depth: int, value: str, terms: list[str], hole: str, contentful: bool, literal: int
) -> None:
    """:func:`_quick_leaf` for a leaf with one placeholder, its value read into ``value``: one
    branch per kind of value (``literal``: the length of the leaf's own text)."""

    def filled(term: str) -> str:
        return 'f"' + "".join("{" + (term if t == hole else t) + "}" for t in terms) + '"'

    w.add(
        depth,
        f"if {value}.__class__ is _str:",
        f"    if (_brace not in {value} or _open not in {value}):",
        f"        text = {filled(value)}",
        "        size = _len(text)",
        "        if size > _max:",
        "            text = _None",
    )
    if contentful:
        w.add(depth + 2, f"contentful = not not {value}.strip(_ws)")
    w.add(
        depth,
        f"elif {value}.__class__ is _int:",
        f"    text = {filled(f'_repr({value})')}",
        "    size = _len(text)",
        "    if size > _max:",
        "        text = _None",
    )
    if contentful:
        w.add(depth + 1, "contentful = _True")
    w.add(depth, f"elif {value} is _None:", f"    text = {filled('_empty')}", f"    size = {literal}")
    if contentful:
        w.add(depth + 1, "contentful = _False")


def _leaf(w: _Writer, depth: int, leaf: Any, item: str, scope: str, contentful: bool, path: Any) -> None:
    """Lines that set ``text`` (and ``contentful`` when asked) to the leaf rendered in
    ``scope``, and ``size`` to its length: filled inline where :func:`_quick_leaf` can, else
    by the compiled leaf."""
    target = "text, contentful" if contentful else "text, _"
    call = [*_render_call(w, target, w.const(leaf.render), scope, path), "size = _len(text)"]
    if _quick_leaf(w, depth, leaf, item, contentful):
        w.add(depth, "if text is _None:", *("    " + line for line in call))
    else:
        w.add(depth, *call)


def _event(
    w: _Writer,
    kind: str,
    path: Any,
    reason: str | None,
    text: str,
    scope: str,
    slot: str | None,
    role: str | None,
    index: str | None = None,
) -> str:
    """The line recording an emit-type event that costs nothing known (no budget, or a skip
    before any count) in its compact form (see :data:`storyforge.engine.trace.RawEvent`): a
    constant head ``(kind, path, reason, None, slot, role)`` with the text and the scope, or
    the enclosing scope and the loop ``index`` for a loop item with no scope of its own."""
    fields = (kind, path, reason, None, slot, role)
    if text == "_None" and scope == "_None" and index is None:
        return f"ev({w.const((fields, None, None))})"  # all constant: one tuple made at build time
    head = w.const(fields)
    if index is not None:
        return f"ev(({head}, {text}, {scope}, {index}))"
    return f"ev(({head}, {text}, {scope}))"


def _costed(
    w: _Writer,
    kind: str,
    path: Any,
    reason: str | None,
    text: str,
    scope: str,
    slot: str | None,
    role: str | None,
) -> str:
    """The line recording an emit-type event with its cost (``cost``) in the eight-field form."""
    return (
        f"ev(({w.const(kind)}, {w.const(path)}, {w.const(reason)}, cost, {text}, {scope}, "
        f"{w.const(slot)}, {w.const(role)}))"
    )


# Token cost under the default estimator (ceil of UTF-16 units / 4), inline.
_COST = "cost = ((_len(text) if text.isascii() else _len(text.encode(_utf16, _sp)) >> 1) + 3) >> 2"
_COST_SIZED = "cost = ((size if text.isascii() else _len(text.encode(_utf16, _sp)) >> 1) + 3) >> 2"
""":data:`_COST` where ``size`` holds ``_len(text)``."""


@dataclass(frozen=True, slots=True)
class _Where:
    """Where plan code runs: its buffer, scope expression, current item, the slot's name
    (``slot`` the expression, ``slot_name`` the value), the variables holding what each open
    local budget scope has left (budgeted programs), and the line that stops a header or
    footer list (``None`` elsewhere)."""

    buf: str
    scope: str
    item: str
    slot: str
    slot_name: str | None
    scopes: tuple[str, ...] = ()
    on_stop: str | None = None
    texts: bool = False
    at: str | None = None
    """What events record for where they happened, when not the scope itself: ``(enclosing,
    index)`` in a loop whose item's scope is built only when a value needs it."""
    index: str | None = None
    """The variable holding the innermost loop's index, where known."""

    @property
    def at_root(self) -> bool:
        """Outside any loop: events record no scope (the trace reads no loop index from it)."""
        return self.scope == ROOT

    @property
    def event_scope(self) -> str:
        if self.at is not None:
            return self.at
        return "_None" if self.at_root else self.scope

    @property
    def frames(self) -> str:
        return "()" if self.at_root else f"{self.scope}.frames"


ROOT = "_Scope(ctx)"
"""The scope outside any loop, built where a value needs it (its events record none)."""


def _fits(w: _Writer, scopes: tuple[str, ...], node_max: str | None = None) -> str:
    """The test that a text costing ``cost`` fits the global budget (when there is one), the
    node's own budget and every open scope."""
    tests = ["consumed + cost <= gmax"] if w.gmax else []
    if node_max is not None:
        tests.insert(0, f"cost <= {node_max}")
    tests += [f"cost <= {left}" for left in scopes]
    return " and ".join(tests) or "_True"


def _spend(w: _Writer, scopes: tuple[str, ...]) -> list[str]:
    """Lines charging ``cost`` to the global budget (when there is one) and every open scope
    (floored at 0)."""
    spent = [f"{left} = {left} - cost if {left} > cost else 0" for left in scopes]
    return ["consumed += cost", *spent] if w.gmax else spent or ["pass"]


def _message(w: _Writer, depth: int, node: MessageBlock, where: _Where, kind: str) -> None:
    """:func:`_message_lines`; a plan message with its own ``maxTokens`` counts its tokens
    even when the render has no global budget (its events carry the cost)."""
    budget = getattr(node, "budget", None)
    if kind == "message" and not w.budgeted and budget is not None and budget.max_tokens is not None:
        w.budgeted = True
        try:
            _message_lines(w, depth, node, where, kind)
        finally:
            w.budgeted = False
        return
    _message_lines(w, depth, node, where, kind)


def _message_lines(w: _Writer, depth: int, node: MessageBlock, where: _Where, kind: str) -> None:
    """A plan message (``kind`` ``message``) or a layout message, header or footer.

    Layout blocks and plan messages outside loops record no scope in their events (the trace
    reads only loop positions from it); plan messages in a loop record their item's scope.
    With a budget, a plan message is skipped when it does not fit (the global budget, its own
    ``maxTokens``, every open scope); a layout block that does not fit is dropped with a
    warning and stops its header or footer list (``where.on_stop``).
    """
    in_plan = kind == "message"
    scope_in_event = where.event_scope if in_plan else "_None"
    slot, role = where.slot_name, node.role

    def skipped(reason: str) -> str:
        return _event(w, kind, node.path, reason, "_None", scope_in_event, slot, role)

    def dropped(cost: str) -> list[str]:
        lines = [f"warnings.append(_dropped({w.const(kind)}, {w.const(node.path)}, {cost}, gmax, consumed))"]
        return lines + ([where.on_stop] if where.on_stop else [])

    if w.gmax:
        w.add(depth, "if consumed >= gmax:", f"    {skipped('out_of_budget')}")
        if not in_plan:
            w.add(depth + 1, *dropped("_None"))
        w.add(depth, "else:")
        depth += 1

    def emit(
        depth: int, text: str, static: str | None = None, filled: bool = False, sized: bool = False
    ) -> None:
        """Lines for a text in hand (``text`` names it; ``static`` is its value when fixed;
        ``filled``: it is surely not empty; ``sized``: ``size`` holds its length)."""
        # A layout block's fixed text is the template's own (bounded by its size, never in a
        # loop): not counted, as in the closures; a plan message's may repeat in a loop.
        if static is not None and not in_plan:
            counted: list[str] = []
        else:
            length = "size" if sized else f"_len({text})"
            counted = _count(w, w.const(len(static)) if static is not None else length, node.path)
        if in_plan or w.texts_only:
            put = [f"{where.buf}.append({w.emitted(role, text, node.prefix, where.texts)})"]
        else:  # onto `out`: surely a message when its text is fixed and no budget can drop it
            put = w.put(role, text, node.prefix)
            sure = (static is not None or filled) and not w.budgeted
            w.last = frozenset((role,)) if sure else w.last | {role}
        if not w.budgeted:
            if static is not None and scope_in_event == "_None":  # nothing depends on the data
                done = f"ev({w.const((kind, node.path, None, None, static, None, slot, role))})"
            else:
                done = _event(w, kind, node.path, None, text, scope_in_event, slot, role)
            if static is not None or filled:
                w.add(depth, *counted, *put, done)
            else:
                w.add(
                    depth,
                    f"if not {text}:",
                    f"    {skipped('empty')}",
                    "else:",
                    *("    " + line for line in (*counted, *put, done)),
                )
            return
        cost = (
            f"cost = {w.const(default_estimator(static))}"
            if static is not None
            else (_COST_SIZED if sized else _COST)
        )
        if text != "text":
            w.add(depth, f"text = {text}")
        done = _costed(w, kind, node.path, None, "text", scope_in_event, slot, role)
        over = _costed(w, kind, node.path, "over_budget", "text", scope_in_event, slot, role)
        if in_plan:
            node_max = getattr(node, "budget", None)
            limit = (
                w.const(node_max.max_tokens)
                if node_max is not None and node_max.max_tokens is not None
                else None
            )
            body = depth
            if static is None:
                w.add(depth, "if not text:", f"    {skipped('empty')}", "else:")
                body += 1
            w.add(body, cost, f"if not ({_fits(w, where.scopes, limit)}):", f"    {over}", "else:")
            w.add(body + 1, *_spend(w, where.scopes), *counted, *put, done)
            return
        # a layout block: its cost is checked before its emptiness (an empty text costs 0)
        w.add(depth, cost, "if cost > 0 and consumed + cost > gmax:", f"    {over}")
        w.add(depth + 1, *dropped("cost"))
        if static is None:
            w.add(depth, "elif not text:", f"    {skipped('empty')}")
        w.add(depth, "else:", *("    " + line for line in ("consumed += cost", *counted, *put, done)))

    leaf = node.leaf
    if node.from_ is not None:
        value = w.fresh("v")
        _resolve(w, depth, node.from_, value, where.scope, False, where.item, where.index)
        # the usual value first: a string, not empty (a text in hand)
        before = w.last
        w.add(depth, f"if {value}.__class__ is _str and {value}:", f"    text = {value}")
        emit(depth + 1, "text", filled=True)
        usual, w.last = w.last, before
        w.add(
            depth,
            f"elif {value} is _None or {value} is _MISSING:",
            f"    {skipped('empty')}",
            f"elif {value} is _FAILED:",
            f"    {skipped('resolver_error')}",
            "else:",
            f"    text = {value} if {value}.__class__ is _str else "
            f"_text_from({value}, {w.const(node.from_)}, {w.const(node.path)}, warnings)",
        )
        emit(depth + 1, "text")
        w.last = w.last | usual
        return
    static = static_text(leaf)
    if static is not None or leaf is None:
        if not static:
            w.add(depth, skipped("empty"))
            return
        emit(depth, w.const(static), static)
        return
    skip_empty = node.skip_if_empty_interpolation and leaf.has_variables
    _leaf(w, depth, leaf, where.item, where.scope, contentful=skip_empty, path=node.path)
    if skip_empty:
        w.add(depth, "if not contentful:", f"    {skipped('empty')}", "else:")
        emit(depth + 1, "text", sized=True)
    else:  # literal text around the placeholders: the text is never empty
        filled = any(isinstance(p, Text) and p.value for p in getattr(leaf, "parts", ()))
        emit(depth, "text", filled=filled, sized=True)


def _plan(w: _Writer, depth: int, nodes: tuple[PlanNode, ...], where: _Where) -> None:
    for node in nodes:
        if isinstance(node, MessageNode):
            _message(w, depth, node, where, "message")
        elif isinstance(node, ForEachNode):
            _for_each(w, depth, node, where)
        elif isinstance(node, IfNode):
            _if(w, depth, node, where)
        else:  # pragma: no cover - the model has no other plan node
            raise TypeError(f"unknown plan node {type(node).__name__}")
    if not nodes:
        w.add(depth, "pass")


def _condition(
    w: _Writer,
    depth: int,
    when: Any,
    condition: Any,
    scope: str,
    item: str | None = None,
    index: str | None = None,
) -> str:
    """Lines that decide a condition; returns the expression holding the outcome.

    A structured condition (§7) resolves its ref inline and makes its one comparison with the
    runtime's own functions, as :func:`storyforge.engine.renderer.build_test` does; a string
    expression runs its compiled closure.
    """
    kind = when.get("type") if isinstance(when, Mapping) else None
    if kind in ("exists", "nonEmpty", "eq", "neq", "gt", "lt"):
        spec = when["ref"]
        ref = DataRef(source=spec["source"], args=spec.get("args"), has_args="args" in spec)
        value, outcome = w.fresh("v"), w.fresh("ok")
        _resolve(w, depth, ref, value, scope, True, item, index)
        if kind == "exists":
            w.add(depth, f"{outcome} = {value} is not _None and {value} is not _MISSING")
        elif kind == "nonEmpty":  # a list or a string with something in it
            w.add(
                depth,
                f"if {value}.__class__ is _list or {value}.__class__ is _str or {value}.__class__ is _tuple:",
                f"    {outcome} = _len({value}) > 0",
                f"elif {value}.__class__ in _plain:",
                f"    {outcome} = _False",
                "else:",
                f"    {outcome} = _non_empty({value})",
            )
        else:
            # no value: undefined, which is not null (decision #20)
            expected = when.get("value", MISSING)
            const = w.const(expected)
            if kind in ("eq", "neq"):
                test = _equal_test(value, expected, const)
                w.add(depth, f"{outcome} = {'not ' if kind == 'neq' else ''}{test}")
            elif not is_real_number(expected):  # only numbers compare
                w.add(depth, f"{outcome} = _False")
            else:
                op = ">" if kind == "gt" else "<"
                w.add(
                    depth,
                    f"{outcome} = ({value} {op} {const}) if {value}.__class__ is _int or {value}.__class__ is _float "
                    f"else (_False if {value}.__class__ in _plain else _compare_numbers({w.const(op)}, {value}, {const}))",
                )
        return outcome
    test = w.const(build_test(when, condition))
    outcome = w.fresh("ok")
    w.needs_state = True
    w.add(depth, f"{outcome} = {test}(st, {scope})")
    return outcome


_PLAIN: frozenset[type] = frozenset({type(None), type(MISSING), bool, int, float, str, list, tuple, dict})
"""The classes whose equality and order :func:`_equal_test` and :func:`_condition` decide inline
(:func:`~storyforge.engine.runtime.deep_equal` and
:func:`~storyforge.engine.runtime.compare_numbers` decide any other)."""


def _equal_test(value: str, expected: Any, const: str) -> str:
    """The expression for ``deep_equal(value, expected)``: inline for an expected ``None``,
    string, number or empty list and a value of a class in :data:`_PLAIN` (a string equals
    only an equal string, a number only an equal number, an empty list only an empty list
    or tuple, and none of them anything else)."""
    cls = expected.__class__
    if expected is None:
        return f"{value} is _None"
    if cls is str:
        same = f"{value}.__class__ is _str"
        equal = f"{value} == {const}"
    elif cls is int or cls is float:
        same = f"{value}.__class__ is _int or {value}.__class__ is _float"
        equal = f"{value} == {const}"
    elif (cls is list or cls is tuple) and not expected:
        same = f"{value}.__class__ is _list or {value}.__class__ is _tuple"
        equal = f"not {value}"
    else:
        return f"_deep_equal({value}, {const})"
    return f"(({equal}) if {same} else (_False if {value}.__class__ in _plain else _deep_equal({value}, {const})))"


def _if(w: _Writer, depth: int, node: IfNode, where: _Where) -> None:
    ok = _condition(w, depth, node.when, node.condition, where.scope, where.item, where.index)
    if where.at_root:
        then, otherwise = (
            w.const(("if", node.path, None, None, b, None, where.slot_name, None)) for b in ("then", "else")
        )
        w.add(depth, f"ev({then} if {ok} else {otherwise})")
    else:
        w.add(
            depth,
            f"ev((_if, {w.const(node.path)}, _None, _None, _then if {ok} else _else, {where.event_scope}, {where.slot}, _None))",
        )
    w.add(depth, f"if {ok}:")
    _plan(w, depth + 1, node.then, where)
    if node.else_:
        w.add(depth, "else:")
        _plan(w, depth + 1, node.else_, where)


def _for_each(w: _Writer, depth: int, node: ForEachNode, where: _Where) -> None:
    value, items = w.fresh("v"), w.fresh("items")
    path, scope, slot = w.const(node.path), where.scope, where.slot
    at = where.event_scope
    stop = node.stop_when_out_of_budget
    if w.gmax and node.budget is not None and stop:
        w.add(
            depth,
            "if consumed >= gmax:",
            f"    ev((_forEach, {path}, {w.const('out_of_budget')}, _None, _None, {at}, {slot}, _None))",
            "else:",
        )
        depth += 1
    _resolve(w, depth, node.source, value, scope, False, where.item, where.index)
    w.add(
        depth,
        f"if {value} is _FAILED:",
        f"    ev((_forEach, {path}, _reason_error, _None, _None, {at}, {slot}, _None))",
        f"elif {value}.__class__ is not _list and {value}.__class__ is not _tuple "
        f"and not _isinstance({value}, (_list, _tuple)):",
        f"    ev((_forEach, {path}, _reason_empty if {value} is _None or {value} is _MISSING else _reason_not_list, "
        f"_None, _None, {at}, {slot}, _None))",
        f"elif not {value}:",
        f"    ev((_forEach, {path}, _reason_empty, 0, _None, {at}, {slot}, _None))",
        "else:",
    )
    depth += 1
    if node.order is not None:
        w.add(depth, f"{items} = _order({value}, {w.const(node.order)})")
    else:
        w.add(depth, f"{items} = {value}")
    if node.limit is not None:
        limit = w.const(node.limit)
        w.add(depth, f"if _len({items}) > {limit}:", f"    {items} = {items}[:{limit}]")
    if where.at_root:
        counted = w.const(("forEach", node.path, None, None, None, None, where.slot_name, None))
        w.add(depth, f"ev(({counted}, _len({items})))")
    else:
        w.add(depth, f"ev((_forEach, {path}, _None, _len({items}), _None, {at}, {slot}, _None))")
    scopes = where.scopes
    counting = w.budgeted
    if node.budget is not None and node.budget.max_tokens is not None:
        # a local budget: its items count tokens, with or without a global budget
        left = w.fresh("left")
        w.add(depth, f"{left} = {w.const(node.budget.max_tokens)}")
        scopes = (*scopes, left)
        w.budgeted = True
    child = node.map[0] if len(node.map) == 1 else None
    # The closures' fast shape: one templated message per item, no node budget; and with no
    # global budget (which the closures' general loop checks before each item), a separator
    # too, each item's message and separator being a group of one message at most.
    separator = node.interleave.leaf if node.interleave is not None else None  # empty: none
    if (
        isinstance(child, MessageNode)
        and child.from_ is None
        and child.leaf is not None
        and static_text(child.leaf) is None
        and child.budget is None
        and (separator is None or not w.gmax)
    ):
        _item_loop(w, depth, node, child, where, items, scopes, separator)
    else:
        _general_loop(w, depth, node, where, items, scopes)
    w.budgeted = counting


def _item_loop(
    w: _Writer,
    depth: int,
    node: ForEachNode,
    child: MessageNode,
    where: _Where,
    items: str,
    scopes: tuple[str, ...],
    separator: Any = None,
) -> None:
    """One templated message per item, and the ``separator`` leaf after each item but the
    last. The item's scope is built only when a leaf needs the general rules; the trace
    then records (enclosing scope, index) as the closures do.

    With a budget and ``stopWhenOutOfBudget`` the loop stops as soon as no item can fit any
    more (one ``out_of_budget`` event), and after an item did not fit, items whose text is
    surely longer than what is left are passed over without being rendered (one
    ``over_budget`` event at the first of them), exactly as the closures do.

    The usual outcome of an item (its message, then its separator, rendered) records no
    event: the buffer's texts are the record, between a ``RUN`` marker before the loop and an
    ``END`` after it; anything else an item records is put between a ``CUT`` and a ``RESUME``
    (see :data:`storyforge.engine.trace.RawEvent`).
    """
    assert child.leaf is not None
    prepend = node.fill_dir == "prepend"
    acc = w.fresh("acc") if prepend else where.buf
    if prepend:
        w.add(depth, f"{acc} = []")
    index, item, sub = w.fresh("i"), w.fresh("item"), w.fresh("s")
    at, frames = where.event_scope, where.frames
    slot, role = where.slot_name, child.role
    cut = f"ev((_cut, _len({acc})))"
    next_item = f"ev((_resume, _len({acc}), {index} + 1, _False))"
    # what comes after item `index`: its separator, or the next item
    after = f"ev((_resume, _len({acc}), {index}, _True))" if separator is not None else next_item
    skip_empty = child.skip_if_empty_interpolation and child.leaf.has_variables
    test = "not text or not contentful" if skip_empty else "not text"
    append = f"{acc}.append({w.emitted(role, 'text', child.prefix, where.texts)})"
    stop = node.stop_when_out_of_budget
    watch = w.budgeted and stop and separator is None
    literal = "".join(p.value for p in getattr(child.leaf, "parts", ()) if isinstance(p, Text))
    keys = item_keys(child.leaf)
    floors = watch and keys is not None and any(keys)  # items too long are passed unrendered
    counted = _count(w, "_len(text)", child.path)
    counted_sized = _count(w, "size", child.path)  # in the usual outcome: the inline fill set `size`

    def room(depth: int) -> None:
        """Lines setting what one more message may cost now, and 4x that in characters (when
        an item's least length is checked against it)."""
        rest = scopes
        if w.gmax:
            w.add(depth, "room = gmax - consumed")
        else:  # counting with no global budget: under at least one local scope
            w.add(depth, f"room = {scopes[0]}")
            rest = scopes[1:]
        for left in rest:
            w.add(depth, f"if {left} < room:", f"    room = {left}")
        if floors:
            w.add(depth, "limit = room << 2")

    if watch:
        room(depth)
        w.add(depth, "tight = _False", "passed = 0", "first = 0")

    def outcome(depth: int, scope_code: str, index_code: str | None) -> None:
        """The item's outcome: ``index_code`` set for the usual one (the item filled inline),
        whose rendered message records nothing; ``None`` for the item rendered in its scope
        (``scope_code``), whose events are recorded (the caller puts them in a CUT ... RESUME)."""
        usual = index_code is not None
        where_at = f"({scope_code}, {index_code})" if index_code is not None else scope_code

        def other(line: str) -> list[str]:
            """The lines of an event other than the usual one."""
            return [cut, line, after] if usual else [line]

        if not w.budgeted:
            event = partial(
                _event, w, "message", child.path, scope=scope_code, slot=slot, role=role, index=index_code
            )
            rendered = [] if usual else [event(reason=None, text="text")]
            count = counted_sized if usual else counted
            if literal and not skip_empty:  # literal text around the placeholders: never empty
                w.add(depth, *count, append, *rendered)
                return
            w.add(
                depth,
                f"if {test}:",
                *("    " + line for line in other(event(reason="empty", text="_None"))),
                "else:",
                *("    " + line for line in count),
                f"    {append}",
                *("    " + line for line in rendered),
            )
            return

        def costed(reason: str | None) -> str:
            if index_code is None:
                return _costed(w, "message", child.path, reason, "text", scope_code, slot, role)
            head = w.const(("message", child.path, reason, None, slot, role))
            return f"ev(({head}, text, {scope_code}, {index_code}, cost))"

        base = depth
        if not (literal and not skip_empty):  # else literal text around the placeholders: never empty
            empty = _event(w, "message", child.path, "empty", "_None", where_at, slot, role)
            w.add(depth, f"if {test}:", *("    " + line for line in other(empty)), "else:")
            base += 1
        w.add(
            base,
            _COST_SIZED if usual else _COST,
            f"if not ({_fits(w, scopes)}):",
            *("    " + line for line in other(costed("over_budget"))),
        )
        if watch:
            w.add(base + 1, "tight = _True")
        w.add(base, "else:")
        w.add(base + 1, *_spend(w, scopes))
        if watch:
            room(base + 1)
        w.add(base + 1, *(counted_sized if usual else counted), append, *([] if usual else [costed(None)]))

    if not w.gmax:
        w.add(depth, *_visit(w, node.path, items))
    last = w.fresh("last")
    if separator is not None:
        w.add(depth, f"{last} = _len({items}) - 1")
    heads = (
        ("message", child.path, None, None, slot, role),
        ("separator", node.path / "interleave", None, None, slot, "user") if separator is not None else None,
        w.budgeted,
        not (w.texts_only or where.texts),
    )
    w.add(
        depth,
        f"ev((_run, {w.const(heads)}, {acc}, _len({acc}), {at}, {last if separator is not None else '_None'}))",
    )
    w.add(depth, f"for {index}, {item} in _enumerate({items}):")
    body = depth + 1
    if w.gmax:
        w.add(body, *_visit(w, node.path, items))
    if watch:
        least = w.const(max(1, default_estimator(literal)))
        w.add(
            body,
            f"if room < {least}:",
            f"    {cut}",
            f"    {_event(w, 'message', child.path, 'out_of_budget', '_None', at, slot, role, index)}",
            "    break",
        )
        if floors:
            assert keys is not None
            w.add(body, f"if tight and {item}.__class__ is _dict:", f"    floor = {w.const(len(literal))}")
            for key in keys:
                if not key:
                    continue
                v = w.fresh("v")
                w.add(
                    body + 1,
                    f"{v} = {item}.get({w.const(key)})",
                    f"if {v}.__class__ is _str and (_brace not in {v} or _open not in {v}):",
                    f"    floor += _len({v})",
                    "    if floor > limit:",
                    "        if not passed:",
                    f"            first = {index}",
                    "        passed += 1",
                    f"        {cut}",
                    f"        {next_item}",
                    "        continue",
                )
    if w.gmax:
        w.add(body, "if consumed >= gmax:")
        if stop:
            w.add(body + 1, "break")
        else:
            w.add(
                body + 1,
                cut,
                _event(w, "message", child.path, "out_of_budget", "_None", at, slot, role, index),
                next_item,
                "continue",
            )
    render = w.const(child.leaf.render)
    quick = _quick_leaf(w, body, child.leaf, item, contentful=skip_empty)
    fallback = body
    if quick:
        w.add(body, "if text is _None:")
        fallback += 1
    w.add(
        fallback,
        cut,
        *_scope_lines(sub, item, frames, index),
        *_render_call(w, "text, contentful", render, sub, child.path),
    )
    outcome(fallback, sub, None)
    w.add(fallback, after)
    if quick:
        w.add(body, "else:")
        outcome(body + 1, at, index)
    if separator is not None:
        _item_separator(w, body, node, separator, where, item, index, last, acc, scopes, cut, next_item)
    w.add(depth, f"ev((_end, _len({acc})))")
    if watch:
        w.add(
            depth,
            "if passed:",
            f"    ev(({w.const('message')}, {w.const(child.path)}, {w.const('over_budget')}, _None, "
            f"_passed_note(passed), ({at}, first), {w.const(slot)}, {w.const(role)}))",
        )
    if prepend:
        w.add(depth, f"{where.buf}.extend(_reversed({acc}))")


def _item_separator(
    w: _Writer,
    depth: int,
    node: ForEachNode,
    separator: Any,
    where: _Where,
    item: str,
    index: str,
    last: str,
    acc: str,
    scopes: tuple[str, ...],
    cut: str,
    next_item: str,
) -> None:
    """The separator after an item of :func:`_item_loop` but the last (the general loop's
    work for it, its events recording (enclosing scope, index)): a fixed text as a constant,
    else filled inline or by its compiled leaf in the item's scope. Rendered, it records
    nothing (the loop's buffer is the record); over budget or empty, what it records (if
    anything) goes between the ``cut`` and ``next_item`` lines."""
    path = node.path / "interleave"
    at, slot = where.event_scope, where.slot_name
    w.add(depth, f"if {index} < {last}:")
    body = depth + 1
    static = static_text(separator)
    if static:
        w.add(body, f"text = {w.const(static)}")
    else:
        quick = _quick_leaf(w, body, separator, item, contentful=False)
        fallback = body + 1 if quick else body
        if quick:
            w.add(body, "if text is _None:")
        sub = w.fresh("s")
        w.add(
            fallback,
            *_scope_lines(sub, item, where.frames, index),
            *_render_call(w, "text, _", w.const(separator.render), sub, path),
            "size = _len(text)",
        )
        w.add(body, "if not text:", f"    {cut}", f"    {next_item}", "else:")  # empty: no event, a cut run
        body += 1
    append = f"{acc}.append({w.emitted('user', 'text', False, where.texts)})"
    w.add(body, *_count(w, w.const(len(static)) if static else "size", path))
    if not w.budgeted:
        w.add(body, append)
        return

    def costed(reason: str | None) -> str:
        return f"ev(({w.const(('separator', path, reason, None, slot, 'user'))}, text, {at}, {index}, cost))"

    w.add(
        body,
        f"cost = {w.const(default_estimator(static))}" if static else _COST_SIZED,
        f"if {_fits(w, scopes)}:",
        *("    " + line for line in _spend(w, scopes)),
        f"    {append}",
        "else:",
        f"    {cut}",
        f"    {costed('over_budget')}",
        f"    {next_item}",
    )


def _item_scope(ctx: Any, item: Any, frames: tuple[Frame, ...], index: int) -> Scope:
    """The scope of one loop item, built by a generated program where a value needs it."""
    return Scope(ctx, item, (*frames, Frame(item, index)))


def _scope_lines(sub: str, item: str, frames: str, index: str) -> list[str]:
    """Lines setting ``sub`` to the scope of one loop item: a :class:`Scope` made without a
    call to its ``__init__`` (``object.__new__`` and its three slots set inline) and a frame
    made by ``tuple.__new__``, which together take half the time of the constructors."""
    return [
        f"{sub} = _new(_Scope)",
        f"{sub}.ctx = ctx",
        f"{sub}.item = {item}",
        # outside any loop, the one frame (a tuple display is one instruction, a starred one three)
        f"{sub}.frames = (_tuple_new(_Frame, ({item}, {index})),)"
        if frames == "()"
        else f"{sub}.frames = (*{frames}, _tuple_new(_Frame, ({item}, {index})))",
    ]


def _general_loop(
    w: _Writer, depth: int, node: ForEachNode, where: _Where, items: str, scopes: tuple[str, ...]
) -> None:
    """Any other loop: every item gets its scope and runs the map's nodes in order."""
    prepend = node.fill_dir == "prepend"
    stop = w.gmax and node.stop_when_out_of_budget
    acc = w.fresh("acc") if prepend else where.buf
    starts, sub, last = w.fresh("starts"), w.fresh("s"), w.fresh("last")
    index, item = w.fresh("i"), w.fresh("item")
    if prepend:
        w.add(depth, f"{acc} = []", f"{starts} = []")
    separator = node.interleave.leaf if node.interleave is not None else None
    if separator is not None:
        w.add(depth, f"{last} = _len({items}) - 1")
    if not w.gmax:
        w.add(depth, *_visit(w, node.path, items))
    w.add(depth, f"for {index}, {item} in _enumerate({items}):")
    body = depth + 1
    if stop:
        w.add(body, "if consumed >= gmax:", "    break")
    if w.gmax:
        w.add(body, *_visit(w, node.path, items))
    # the item's scope, built where a value needs it (most read the item inline); events
    # record (enclosing, index), which gives the trace the same loop position
    w.add(body, f"{sub} = _None")
    scope = f"({sub} if {sub} is not _None else ({sub} := _item_scope(ctx, {item}, {where.frames}, {index})))"
    at = f"({where.event_scope}, {index})"
    if prepend:
        w.add(body, f"{starts}.append(_len({acc}))")
    inner = _Where(
        buf=acc,
        scope=scope,
        item=item,
        slot=where.slot,
        slot_name=where.slot_name,
        scopes=scopes,
        texts=where.texts,
        at=at,
        index=index,
    )
    if stop and len(node.map) > 1:
        # after each node, a spent budget skips the item's remaining nodes
        w.add(body, "while _True:")
        for n, child in enumerate(node.map):
            _plan(w, body + 1, (child,), inner)
            if n < len(node.map) - 1:
                w.add(body + 1, "if consumed >= gmax:", "    break")
        w.add(body + 1, "break")
    else:
        _plan(w, body, node.map, inner)
    if separator is not None:
        sep_path = node.path / "interleave"
        w.add(body, f"if {index} < {last}:")
        _leaf(w, body + 1, separator, item, scope, contentful=False, path=sep_path)
        w.add(body + 1, "if text:", *("    " + line for line in _count(w, "_len(text)", sep_path)))
        if prepend:
            w.add(body + 2, f"{starts}.append(_len({acc}))")
        append = f"{acc}.append({w.emitted('user', 'text', False, where.texts)})"
        if w.budgeted:
            w.add(
                body + 2,
                _COST,
                f"if {_fits(w, scopes)}:",
                *("    " + line for line in _spend(w, scopes)),
                f"    {append}",
                f"    {_costed(w, 'separator', sep_path, None, 'text', at, where.slot_name, 'user')}",
                "else:",
                f"    {_costed(w, 'separator', sep_path, 'over_budget', 'text', at, where.slot_name, 'user')}",
            )
        else:
            w.add(
                body + 2,
                append,
                _event(
                    w, "separator", sep_path, None, "text", where.event_scope, where.slot_name, "user", index
                ),
            )
    if prepend:
        # Groups (and separators) in reverse order, each group's messages in their own order.
        w.add(
            depth,
            f"if {starts} == _list(_range(_len({acc}))):",
            f"    {where.buf}.extend(_reversed({acc}))",
            "else:",
            f"    end = _len({acc})",
            f"    for start in _reversed({starts}):",
            f"        {where.buf}.extend({acc}[start:end])",
            "        end = start",
        )


def _layout(
    w: _Writer,
    depth: int,
    template: Template,
    buffers: dict[str, str],
    kinds: dict[str, set[tuple[str, bool]]],
) -> None:
    """The layout in order, its messages put onto ``out`` as squashing would
    (:meth:`_Writer.put`). A slot buffer of texts (one role and prefix in ``kinds``) is placed as
    one message of them joined with ``"\\n"``, which is what squashing makes of them; a buffer
    of several roles is squashed onto ``out`` at run time (``_merge_onto``)."""
    for node in template.layout:
        if isinstance(node, LayoutSlot):
            buf = buffers.get(node.name)
            name = w.const(node.name)
            if buf is None:  # a slot the template does not define: always empty
                buf = w.fresh("b")
                w.add(depth, f"{buf} = []")
            inner = depth
            before = w.last
            if node.omit_if_empty:
                w.add(
                    depth,
                    f"if not {buf}:",
                    f"    ev({w.const(('insert', node.path, 'empty', None, None, None, node.name, None))})",
                    "else:",
                )
                inner += 1
            for blocks, kind in ((node.header, "header"), (node.footer, "footer")):
                if blocks:
                    # a block that does not fit the budget stops the rest of its list
                    stops = w.gmax and len(blocks) > 1
                    where = _Where(
                        buf="out",
                        scope=ROOT,
                        item="_None",
                        slot=name,
                        slot_name=node.name,
                        on_stop="break" if stops else None,
                    )
                    level = inner
                    if stops:
                        w.add(inner, "while _True:")
                        level += 1
                    for block in blocks:
                        _message(w, level, block, where, kind)
                    if stops:
                        w.add(level, "break")
                if kind == "header":
                    _place(w, inner, buf, kinds.get(node.name, set()), node.omit_if_empty)
                    w.add(
                        inner,
                        f"ev(({w.const(('insert', node.path, None, None, None, None, node.name, None))}, _len({buf})))",
                    )
            if node.omit_if_empty:
                w.last = w.last | before
        else:
            assert isinstance(node, LayoutMessage)
            _message(
                w,
                depth,
                node,
                _Where(buf="out", scope=ROOT, item="_None", slot="_None", slot_name=None),
                "layout",
            )


def _place(w: _Writer, depth: int, buf: str, kinds: set[tuple[str, bool]], filled: bool) -> None:
    """Lines placing the slot buffer ``buf`` (its ``(role, prefix)`` kinds; ``filled``: it is
    surely not empty here) onto ``out``."""
    if not kinds:  # a plan that emits nothing
        return
    if w.texts_only:
        w.add(depth, f"out += {buf}")
        return
    if len(kinds) == 1:
        ((role, prefix),) = kinds
        if w.last == {role}:  # surely joined onto the last message: its texts go to `pend` as they are
            lines = [
                "if pend is _None:",
                f"    pend = [cur[{w.const('content')}], *{buf}]",
                "else:",
                f"    pend += {buf}",
            ]
            if prefix:
                lines.append(f"cur[{w.const('prefix')}] = _True")
            w.pending = True
        else:
            lines = [f"text = _nl.join({buf})", *w.put(role, "text", prefix)]
        if filled:
            w.add(depth, *lines)
            w.last = frozenset((role,))
        else:
            w.add(depth, f"if {buf}:", *("    " + line for line in lines))
            w.last = w.last | {role}
        return
    w.add(depth, *w.settled(), f"cur = _merge_onto(out, {buf}, cur)")
    roles = {role for role, _ in kinds}
    w.last = frozenset(roles) if filled else w.last | roles


def _merge_onto(out: list[dict[str, Any]], messages: list[Any], cur: dict[str, Any] | None) -> Any:
    """``messages`` (``(role, text, prefix)``) appended to ``out`` as
    :func:`~storyforge.engine.assembler.squash` writes them, the first joined to ``cur`` (the
    last message of ``out``, or ``None``) when it has its role; returns the new last message."""
    last: Any = cur["role"] if cur is not None else _merge_onto  # a value no role equals
    run: list[str] | None = None  # the texts of the current message, once it has two
    for role, text, prefix in messages:
        if role == last:
            if run is None:
                run = [cur["content"]]  # type: ignore[index]
            run.append(text)
            if prefix:
                cur["prefix"] = True  # type: ignore[index]
            continue
        if run is not None:
            cur["content"] = "\n".join(run)  # type: ignore[index]
            run = None
        cur = {"role": role, "content": text, "prefix": True} if prefix else {"role": role, "content": text}
        out.append(cur)
        last = role
    if run is not None:
        cur["content"] = "\n".join(run)  # type: ignore[index]
    return cur


def _returned(messages: str, info: str) -> list[str]:
    """Lines returning the :class:`RenderResult` of ``messages`` (an expression), its slots
    set inline as :func:`~storyforge.engine.renderer.render` sets them (``info`` is the
    expression of its ``_info``)."""
    return [
        "result = _Result()",
        f"result.messages = {messages}",
        "result.warnings = warnings",
        "result._events = events",
        f"result._info = {info}",
        "return result",
    ]


def _passed_note(passed: int) -> str:
    return f"{passed} item{'s' if passed > 1 else ''} from here on too long for what was left, not rendered"


_EVENT = re.compile(r"\bev\(")
"""How the writers above spell recording an event; the program calls ``events.append``
itself (a list's own ``append`` called by name runs inline, a bound method held in a
variable is a call)."""

_FIRST_EVENT = re.compile(r"    ev\((c[0-9]+)\)")
_SIMPLE = re.compile(r"    (?!if |for |try:|while |with |else|elif |except|return )[^ ]")


def _open_out(body: list[str]) -> None:
    """``out`` made with its first message when the layout opens with one it always shows."""
    at = body.index("    out = []")
    if (
        body[at + 1 : at + 2]
        and body[at + 1].startswith("    cur = {")
        and body[at + 2 : at + 3] == ["    out.append(cur)"]
    ):
        body[at : at + 3] = [body[at + 1], "    out = [cur]"]


def _first_events(body: list[str]) -> list[str]:
    """The constant events the program records before anything can branch, in order, when
    ``body`` opens with them (its lines before them are moved after them: else ``[]``): the
    program starts its events list with them, one list made instead of one call each.

    Only the events list sees the order, and nothing before them records an event (a line
    of the function's own level that reads the render state could, so one ends the run, and
    so does an event made at run time: moving it after the constants would reorder the trace)."""
    events: list[str] = []
    moved: list[str] = []
    for line in body:
        event = _FIRST_EVENT.fullmatch(line)
        if event is not None:
            events.append(event[1])
        elif _SIMPLE.match(line) and not re.search(r"\bst\b", line) and not _EVENT.search(line):
            moved.append(line)
        else:
            break
    if not events:
        return []
    del body[: len(events) + len(moved)]
    body[:0] = moved
    return events


_REFS = re.compile(r"\b(?:out|cur|pend|st|events)\b|\bev\(")
"""What reads or writes the render's messages or events (``ev(`` is how an event is written)."""
_PUT = re.compile(r"    cur = (\{.*\})")
_EV = re.compile(r"    ev\((.*)\)")
_TAIL = re.compile(r"    if \(chars(?: \* [0-9]+)? \+ c[0-9]+\) \* 2 > _max_out:|    result = _Result\(\)")
"""Where the end of a program (the size check of its messages, then its result) starts."""
_NAMES = re.compile(r"\b(?!c[0-9]+\b)[A-Za-z][A-Za-z0-9_]*\b")
"""The variables an expression reads (constants ``c0``, ``c1``, … and ``_``-helpers aside)."""


def _straight(w: _Writer, body: list[str]) -> tuple[list[str], str] | None:
    """``body`` with its messages built as one list display and its events recorded as one
    tuple once the last message is known, and the source of ``events_of``, which makes the
    events list of that tuple; when every message and event is written at the function's own
    level (a layout of messages, each always shown: no branch decides whether one is written,
    nothing reads ``out`` or the events before the end, no message joins the one before).
    Else ``None``.

    The tuple is ``(events_of, value, …)``: the values the events read that the data decides
    (a message's text), so that a render makes one small tuple where it made a tuple per
    message and a list; the trace, made only when it is read, calls ``events_of`` on it. A
    list display is one allocation where appending is a call per item and the list's
    regrowth. Each message is still made where it was, and each value an event reads kept
    there, when a line below (other than the messages and events) mentions what it reads (it
    may change below); else the display or the tuple reads it."""
    end = next((i for i, line in enumerate(body) if _TAIL.fullmatch(line)), None)
    if end is None or any(re.search(r"\b(?:cur|pend|st)\b|\bev\(", line) for line in body[end:]):
        return None
    at: list[int] = []
    i = 0
    while i < end:
        line = body[i]
        if _REFS.search(line):
            if line == "    out = []" or _EV.fullmatch(line):
                at.append(i)
            elif _PUT.fullmatch(line) and body[i + 1 : i + 2] == ["    out.append(cur)"]:
                at.append(i)
                i += 1
            else:
                return None
        i += 1
    if not at or body[at[0]] != "    out = []":
        return None
    written = {j for i in at for j in (i, i + 1) if _PUT.fullmatch(body[i]) or j == i}
    messages: list[str] = []
    events: list[str] = []
    values: list[str] = []
    kept = body[: at[0]]
    previous = at[0] + 1  # past `out = []`
    for start in at[1:]:
        kept.extend(body[previous:start])
        line = body[start]
        put = _PUT.fullmatch(line)
        previous = start + (2 if put else 1)
        expr = put[1] if put else _EV.fullmatch(line)[1]  # type: ignore[index]
        below = "\n".join(body[j] for j in range(previous, end) if j not in written)
        names = sorted({n for n in _NAMES.findall(expr) if not keyword.iskeyword(n)})
        changes = [name for name in names if re.search(rf"\b{name}\b", below)]
        if put:
            if changes:
                held = w.fresh("m")
                kept.append(f"    {held} = {expr}")
                expr = held
            messages.append(expr)
            continue
        for name in names:
            value = name
            if name in changes:
                value = w.fresh("e")
                kept.append(f"    {value} = {name}")
            values.append(value)
            expr = re.sub(rf"\b{name}\b", f"x[{len(values)}]", expr)
        events.append(expr)
    kept.extend(body[previous:end])
    kept.append(f"    out = [{', '.join(messages)}]")
    kept.append(f"    events = ({', '.join(['events_of', *values])}{'' if values else ','})")
    kept.extend(body[end:])
    return kept, f"def events_of(x):\n    return [{', '.join(events)}]\n"


def generate_program(
    template: Template, slot_info: tuple[SlotInfo, ...], budgeted: bool = False
) -> GeneratedProgram | None:
    """The template's render as one function; ``None`` when the template nests deeper than
    Python's compiler allows or would take more than :data:`MAX_LINES` lines (the closures
    render it).

    ``budgeted=False``: ``program(ctx, handlers, estimate)``, for renders with no budget
    (``estimate`` ``None`` for the default estimator: one test where the result is made).
    Under a slot's or node's ``maxTokens`` it counts tokens with the default estimator; its
    ``counts`` attribute says whether the template sets any, and then a render counting with
    another estimator takes the closures.
    ``budgeted=True``: ``program(ctx, handlers, estimate, gmax)``, for renders with a global
    budget of ``gmax`` tokens counted with the default estimator. Either returns the
    :class:`RenderResult`; ``estimate`` is what the trace counts tokens with, if it is read.
    """
    try:
        return _generate_program(template, slot_info, budgeted)
    except _TooLong:
        return None


def _generate_program(
    template: Template, slot_info: tuple[SlotInfo, ...], budgeted: bool
) -> GeneratedProgram | None:
    roles = _roles(template)
    texts_only = len(roles) == 1 and not next(iter(roles))[1]
    w = _Writer(lines=[], constants=[], by_value={}, texts_only=texts_only, budgeted=budgeted, gmax=budgeted)
    fixed = sum(
        len(static_text(block.leaf) or "")
        for node in template.layout
        for block in ((node,) if isinstance(node, LayoutMessage) else (*node.header, *node.footer))
    )
    shown = max(Counter(n.name for n in template.layout if isinstance(n, LayoutSlot)).values(), default=1)
    most = _most_counted(template)
    # every text counted at most `shown` times, the fixed texts and a line break per message
    w.bounded = most is not None and (most * shown + fixed) * 2 <= int(_HELPERS["_max_out"])
    buffers: dict[str, str] = {}
    kinds_of: dict[str, set[tuple[str, bool]]] = {}
    made: dict[str, int] = {}  # each slot's buffer: the line that makes it
    for slot in sorted(template.slots.values(), key=lambda s: s.priority):
        buf = w.fresh("b")
        buffers[slot.name] = buf
        name = w.const(slot.name)
        w.add(1, f"# slot {w.const(slot.path)}", f"{buf} = []")
        made[buf] = len(w.lines) - 1
        body = 1
        if slot.condition is not None:
            ok = _condition(w, 1, slot.when, slot.condition, ROOT)
            w.add(
                1,
                f"if not {ok}:",
                f"    ev({w.const(('slot', slot.path, 'condition_false', None, None, None, slot.name, None))})",
                "else:",
            )
            body = 2
        w.add(body, f"ev({w.const(('slot', slot.path, None, None, None, None, slot.name, None))})")
        scopes: tuple[str, ...] = ()
        if slot.budget is not None and slot.budget.max_tokens is not None:
            # the slot's plan counts tokens, with or without a global budget
            left = w.fresh("left")
            w.add(body, f"{left} = {w.const(slot.budget.max_tokens)}")
            scopes = (left,)
            w.budgeted = True
        kinds = kinds_of[slot.name] = _plan_roles(slot.plan)
        texts = len(kinds) == 1  # one (role, prefix): the buffer holds texts, joined when placed
        where = _Where(
            buf=buf, scope=ROOT, item="_None", slot=name, slot_name=slot.name, scopes=scopes, texts=texts
        )
        _plan(w, body, slot.plan, where)
        w.budgeted = budgeted
    w.add(1, "out = []")
    _layout(w, 1, template, buffers, kinds_of)
    slots, name = w.const(slot_info), w.const(template.id)
    if budgeted:
        trace = f"(estimate, gmax, consumed, {slots}, {name})"
    else:  # the usual estimator's is made once, here
        usual = w.const((default_estimator, None, None, slot_info, template.id))
        trace = f"({usual} if estimate is _None else (estimate, _None, _None, {slots}, {name}))"
    if texts_only:
        role = w.const(next(iter(roles))[0])
        w.add(
            1,
            "if not out:",
            *("    " + line for line in _returned("[]", trace)),
            "text = _nl.join(out)",
            *(() if w.bounded else ("if _len(text) > _max_out:", "    _too_long(_len(text))")),
            *_returned(f"[{{{w.const('role')}: {role}, {w.const('content')}: text}}]", trace),
        )
    else:
        # What squashing checks: the messages' total size. The counted texts are at most
        # `chars` (a slot's texts are counted once, when its plan renders, and placed as
        # many times as the layout shows the slot: at most `shown` times), the uncounted
        # (fixed layout texts) at most `fixed`, and every message joined to another adds one
        # line break (no message is empty): at most as many. A bounded program cannot pass it.
        counted = "chars" if shown == 1 else f"chars * {shown}"
        content = w.const("content")
        w.add(1, *w.settled())
        if not w.bounded:
            w.add(
                1,
                f"if ({counted} + {w.const(fixed)}) * 2 > _max_out:",
                "    total = 0",
                "    for message in out:",
                f"        total += _len(message[{content}])",
                "    if total > _max_out:",
                "        _too_long(total)",
            )
        w.add(1, *_returned("out", trace))
    lines = "\n".join(w.lines)
    # a slot the layout does not show and whose plan puts nothing in it needs no buffer
    unused = {made[buf] for buf in made if len(re.findall(rf"\b{buf}\b", lines)) == 1}
    kept = [line for i, line in enumerate(w.lines) if i not in unused]
    straight = None if texts_only or w.needs_state else _straight(w, kept)
    head = [f"def program(ctx, handlers, estimate{', gmax' if budgeted else ''}):"]
    decoder = ""
    if straight is not None:
        kept, decoder = straight
    else:
        first = _first_events(kept)
        _open_out(kept)
        head.append(f"    events = [{', '.join(first)}]")
    head.append("    warnings = []")
    lines = _EVENT.sub("events.append(", "\n".join(kept))
    # the loop and text counters, set only when a line reads them (half of all programs have no loop)
    head.extend(f"    {name} = 0" for name in ("visited", "chars") if re.search(rf"\b{name}\b", lines))
    mentions = re.search(r"^.*\bcur\b.*$", lines, re.MULTILINE)
    if mentions is not None and not mentions[0].startswith("    cur = {"):
        head.append("    cur = _None")  # read before set only where `out` may be empty
    if re.search(r"\bpend\b", lines):
        head.append("    pend = _None")
    if budgeted:
        head.append("    consumed = 0")
    if w.needs_state:  # a condition that runs as a closure reads the render state
        head.append("    st = _State.for_program(ctx, handlers, events, warnings)")
    # the helpers' own None, True and False as Python's constants: a test against one is one
    # instruction rather than a global read and a comparison
    source = re.sub(r"\b_(None|True|False)\b", r"\1", "\n".join(head) + "\n" + lines + "\n" + decoder)
    namespace: dict[str, Any] = {"__builtins__": {}, **_HELPERS}
    namespace.update({f"c{i}": value for i, value in enumerate(w.constants)})
    try:
        code = compile(source, "<storyforge generated program>", "exec")
    except (SyntaxError, RecursionError, MemoryError):
        # Nesting deeper than Python's parser allows (about 20 loops): the closures render it.
        return None
    exec(code, namespace)  # noqa: S102 - our own source, no template text in it
    fn = namespace.pop("program")  # the namespace (its globals) must not hold it: no cycle
    fn.source = source
    fn.constants = tuple(w.constants)
    fn.counts = not budgeted and _budgeted(template)
    return cast(GeneratedProgram, fn)


_HELPERS["_passed_note"] = _passed_note
_HELPERS["_merge_onto"] = _merge_onto
_HELPERS["_plain"] = _PLAIN
_HELPERS["_item_scope"] = _item_scope
