"""Leaf strings and string conditions -> frozen AST -> compiled :class:`Leaf` / :class:`Condition`.

Takes: a leaf string (``"Hello {{ name | upper }}"``) or a condition (a string expression or a
structured mapping) plus the :class:`TemplatePath` it sits at. Gives: :func:`compile_leaf`,
:func:`compile_condition` and :func:`parse_expression`. Syntax problems raise
:class:`TemplateValidationError` whose issues carry code ``"syntax"``, the path, the line and
column inside the string, a caret excerpt and a sentence saying what was expected and found.

How a leaf is read: the string is split with the reference rule ``\\{\\{([^{}]+)}}`` (left to
right, unmatched braces stay literal). Each placeholder is then either

* a block tag: its trimmed text starts with ``#`` or ``/``, or is ``else``;
* an extension expression: its trimmed text starts with ``$``, or has a quoted bracket
  segment (``a["x.y"]``, whose quotes the grammar removes), or contains (outside ``[...]``
  segments) one of ``| ( ) " ' < > = ! + ,``, or has two or more words one of which is the
  word ``and``, ``or``, ``not``, ``in`` or a lone ``-``;
* otherwise a plain reference path, resolved exactly as StoryForge does (spaces, brackets and
  dots included) without going through the grammar.

Block tags and expressions are parsed with ``grammar/interpolation.lark``; ``{{#if}}`` blocks
are then matched with a stack here, so errors can name the innermost open block.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import gc
import marshal
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, cast

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.visitors import merge_transformers

from storyforge.engine import nodes as n
from storyforge.engine.conditions import build_condition
from storyforge.engine.errors import Issue, TemplatePath, TemplateValidationError, did_you_mean
from storyforge.engine.evaluator import FUNCTIONS, compile_expr, compile_parts
from storyforge.engine.filters import FILTERS
from storyforge.engine.grammar import load_parser
from storyforge.engine.nodes import Condition, Expr, Leaf, Part, Span, freeze
from storyforge.engine.runtime import JS_WHITESPACE, MAX_NESTING, RESERVED_SOURCES, parse_path, truthy

__all__ = ["compile_condition", "compile_leaf", "gc_paused", "is_expression", "parse_expression"]

ROOT = TemplatePath()
"""The default path of a string compiled on its own."""

PLACEHOLDER = re.compile(r"\{\{([^{}]+)}}")
"""The reference placeholder rule (§5.1)."""

_TRIGGER_CHARS = frozenset("|()\"'<>=!+,")
_TRIGGER_WORDS = frozenset({"and", "or", "not", "in", "-"})
_BRACKETS = re.compile(r"\[[^\]]*\]")
_QUOTED_BRACKET = re.compile(r"""\[\s*(?:"[^"\]]*"|'[^'\]]*')\s*\]""")
_TAG = re.compile(r"([#/])([A-Za-z_][A-Za-z0-9_]*)?")
_ELSE = re.compile(r"else(?:\s|\Z)")
_PATH_HEAD = re.compile(r"\$?[A-Za-z_][A-Za-z0-9_]*")
_PATH_SEGMENT = re.compile(
    r"""\.?\[("[^"\\\n]*(?:\\.[^"\\\n]*)*"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'|[^\]\n]*)\]|\.([A-Za-z0-9_]+)"""
)
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""After decoding, a pair of surrogate escapes is one character: any surrogate left is lone."""
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"', "'": "'"}
_PREVIOUS_TOKEN = re.compile(
    r"""#if|/if|[$A-Za-z_][A-Za-z0-9_.$]*(?:\[[^\]]*\][A-Za-z0-9_.]*)*|\d+(?:\.\d+)?|"[^"\\]*(?:\\.[^"\\]*)*"|"""
    r"""'[^'\\]*(?:\\.[^'\\]*)*'|==|!=|<=|>=|\S"""
)


def is_expression(inner: str) -> bool:
    """True when a placeholder's text is read as an extension expression (see module docstring)."""
    text = inner.strip(JS_WHITESPACE)
    if text.startswith("$") or _QUOTED_BRACKET.search(text):
        return True  # a quoted key in brackets (a["x.y"]) is unquoted by the grammar
    bare = _BRACKETS.sub(" ", text)
    if not _TRIGGER_CHARS.isdisjoint(bare):
        return True
    words = bare.split()
    return len(words) > 1 and not _TRIGGER_WORDS.isdisjoint(words)


def _is_tag(text: str) -> bool:
    return text[:1] in ("#", "/") or _ELSE.match(text) is not None


# ---------------------------------------------------------------------------------------------
# Positions and messages


@lru_cache(maxsize=64)
def _newlines(text: str) -> tuple[int, ...]:
    """Offsets of every newline in ``text`` (computed once per string, so positions are O(log n))."""
    return tuple(match.start() for match in re.finditer("\n", text))


def _line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset``; linear in the placeholders of a string, not quadratic."""
    newlines = _newlines(text)
    before = bisect.bisect_left(newlines, offset)
    start = newlines[before - 1] + 1 if before else 0
    return before + 1, offset - start + 1


def _caret(text: str, offset: int) -> str:
    """The source line holding ``offset`` with a caret under it (long lines are windowed)."""
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    line = text[start : end if end != -1 else len(text)]
    column = offset - start
    if len(line) > 100:
        left = max(0, column - 50)
        line = ("…" if left else "") + line[left : left + 100] + ("…" if left + 100 < len(line) else "")
        column = column - left + (1 if left else 0)
    line = "".join(" " if ch in "\t\r\v\f" else ch for ch in line)
    return f"{line}\n{' ' * column}^"


class _Problem(Exception):
    """One syntax issue found while reading a string (offset inside the whole string)."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def _issue(text: str, problem: _Problem, path: TemplatePath = ROOT) -> Issue:
    offset = max(0, min(problem.offset, len(text)))
    line, column = _line_col(text, offset)
    return Issue(
        code="syntax",
        path=path,
        message=problem.message,
        line=line,
        column=column,
        context=_caret(text, offset),
    )


def _show(text: str) -> str:
    shown = text if len(text) <= 30 else text[:27] + "..."
    return "'" + shown.encode("unicode_escape").decode("ascii").replace("\\\\", "\\") + "'"


def _join_words(words: list[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


_STARTERS = frozenset({"(", "[", "{", "-", "not", "true", "false", "null"})
_OPERATORS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in", "not", "and", "or", "+", "-"})
_NAMED = {"PATH": "a name", "RESERVED": "a reserved name", "NUMBER": "a number", "STRING": "a string"}
_PUNCTUATION_ORDER = ("(", ")", "]", "}", ",", ":", "|", "#if", "/if", "else")


def _describe_expected(parser: Lark, names: Iterable[str], end_word: str) -> str:
    values: set[str] = set()
    named: set[str] = set()
    has_end = False
    for name in names:
        base = name.rsplit("__", 1)[-1] if "__" in name and not name.startswith("__") else name
        if name == "$END":
            has_end = True
        elif base in _NAMED:
            named.add(base)
        else:
            try:
                pattern = parser.get_terminal(name).pattern
            except KeyError:
                continue
            values.add(pattern.value if pattern.type == "str" else name)
    words: list[str] = []
    if named & {"PATH", "NUMBER", "STRING"}:
        words.append("an expression")
        values -= _STARTERS
        named.clear()
    if values & (_OPERATORS - {"not", "-"}):
        words.append("an operator")
        values -= _OPERATORS
    words.extend(_NAMED[name] for name in sorted(named))
    ordered = sorted(
        values, key=lambda v: (_PUNCTUATION_ORDER.index(v) if v in _PUNCTUATION_ORDER else 99, v)
    )
    words.extend(f"'{value}'" for value in ordered)
    if has_end:
        words.append(end_word)
    return _join_words(words) or "something else"


def _previous_token(text: str, offset: int) -> str | None:
    tokens = _PREVIOUS_TOKEN.findall(text[:offset])
    return tokens[-1] if tokens else None


def _accepted_terminals(interactive: Any, parser: Lark) -> list[str]:
    """Terminals that really advance the parser from the error state.

    Lark's own ``InteractiveParser.accepts()`` skips terminals whose name is not all upper
    case, which drops namespaced ones such as ``expr__PATH``; this repeats it for every
    terminal name. Feeding runs without callbacks, so no tree is built.
    """
    terminals = {t.name for t in parser.terminals} | {"$END"}
    conf = copy.copy(interactive.parser_state.parse_conf)
    conf.callbacks = {}
    accepted: list[str] = []
    for name in interactive.choices():
        if name not in terminals:
            continue
        cursor = interactive.copy(deepcopy_values=False)
        cursor.parser_state.parse_conf = conf
        try:
            cursor.feed_token(Token(name, ""))
        except UnexpectedToken:
            continue
        accepted.append(name)
    return accepted


def _lark_problem(
    error: UnexpectedInput, parser: Lark, inner: str, base: int, end_word: str, end_offset: int
) -> _Problem:
    """Turn a Lark error into a sentence: what was expected, after what, and what was found."""
    choices: Iterable[str] = ()
    if error.interactive_parser is not None:
        choices = _accepted_terminals(error.interactive_parser, parser)
    if isinstance(error, UnexpectedToken):
        if not choices:
            choices = error.expected
        if error.token.type == "$END":
            found, position = end_word, len(inner)
            offset = end_offset
        else:
            found, position = _show(str(error.token)), error.token.start_pos or 0
            offset = base + position
    elif isinstance(error, UnexpectedCharacters):
        if not choices:
            choices = error.allowed or ()
        position = error.pos_in_stream or 0
        found, offset = _show(inner[position : position + 1]), base + position
    else:  # pragma: no cover - LALR raises only the two kinds above
        return _Problem(base, f"invalid syntax: {error}")
    accepted = {_terminal_text(parser, name) for name in choices}
    expected = _describe_expected(parser, choices, end_word)
    before = _previous_token(inner, position)
    after = f" after {_show(before)}" if before else ""
    message = f"expected {expected}{after}, got {found}"
    found_text = found.strip("'")
    wants_operand = any(name.endswith("PATH") for name in accepted)
    if found_text in _COMPARISONS and accepted.isdisjoint(_COMPARISONS) and not wants_operand:
        if "|" in accepted and "and" not in accepted:
            message += "; filters apply to everything on their left, so compare a filtered value in parentheses: (x | length) > 2"
        else:
            message += "; comparisons cannot be chained, combine them with 'and'"
    elif found_text == "=" and "==" in accepted | {"=="}:
        message += "; use '==' to compare"
    return _Problem(offset, message)


_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})


def _terminal_text(parser: Lark, name: str) -> str:
    try:
        pattern = parser.get_terminal(name).pattern
    except KeyError:
        return name
    return str(pattern.value) if pattern.type == "str" else name


# ---------------------------------------------------------------------------------------------
# Lark tree -> AST


def _decode_string(token: str) -> str:
    body = token[1:-1]

    def unescape(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] == "u" and len(code) == 5:
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, code)

    text = _ESCAPE.sub(unescape, body)
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        return text


def split_path_token(token: str) -> tuple[str, tuple[str, ...]]:
    """``"a.b[0]['x y']"`` -> ``("a", ("b", "0", "x y"))``; quoted brackets are unquoted."""
    head = _PATH_HEAD.match(token)
    assert head is not None, token
    segments: list[str] = []
    for match in _PATH_SEGMENT.finditer(token, head.end()):
        bracket, dotted = match.groups()
        if dotted is not None:
            segments.append(dotted)
        elif len(bracket) >= 2 and bracket[0] == bracket[-1] and bracket[0] in "\"'":
            segments.append(_decode_string(bracket))
        else:
            segments.append(bracket)
    return head.group(0), tuple(segments)


@v_args(meta=True, inline=True)
class ExprToAst(Transformer[Token, Any]):
    """Builds expression nodes from ``expr.lark`` trees; positions are offset into the full string."""

    def __init__(self, source: str, base: int) -> None:
        super().__init__()
        self._source = source
        self._base = base

    def _span(self, meta: Any) -> Span | None:
        if getattr(meta, "empty", True):
            return None
        start = self._base + meta.start_pos
        line, column = _line_col(self._source, start)
        return Span(start, self._base + meta.end_pos, line, column)

    def number(self, meta: Any, token: Token) -> n.Literal:
        text = str(token)
        # very long digit strings become floats (inf): int() refuses more than 4300 digits
        value: int | float = int(text) if text.isdigit() and len(text) <= 4000 else float(text)
        return n.Literal(value=value, span=self._span(meta))

    def string(self, meta: Any, token: Token) -> n.Literal:
        return n.Literal(value=_decode_string(str(token)), span=self._span(meta))

    def true(self, meta: Any) -> n.Literal:
        return n.Literal(value=True, span=self._span(meta))

    def false(self, meta: Any) -> n.Literal:
        return n.Literal(value=False, span=self._span(meta))

    def null(self, meta: Any) -> n.Literal:
        return n.Literal(value=None, span=self._span(meta))

    def path(self, meta: Any, token: Token) -> n.Path:
        head, rest = split_path_token(str(token))
        return n.Path(segments=(head, *rest), span=self._span(meta))

    def reserved(self, meta: Any, token: Token) -> n.Reserved:
        head, rest = split_path_token(str(token))
        return n.Reserved(name=head, segments=rest, span=self._span(meta))

    def call(self, meta: Any, name: Token, *args: Expr) -> n.Call:
        return n.Call(name=str(name), args=args, span=self._span(meta))

    def list(self, meta: Any, *items: Expr) -> n.ListExpr:
        return n.ListExpr(items=items, span=self._span(meta))

    def pair(self, meta: Any, key: Token, value: Expr) -> tuple[str, Expr]:
        return (_decode_string(str(key)), value)

    def dict(self, meta: Any, *pairs: tuple[str, Expr]) -> n.DictExpr:
        return n.DictExpr(items=pairs, span=self._span(meta))

    def negation(self, meta: Any, operand: Expr) -> n.Not:
        return n.Not(operand=operand, span=self._span(meta))

    def neg(self, meta: Any, operand: Expr) -> n.Neg:
        return n.Neg(operand=operand, span=self._span(meta))

    def or_test(self, meta: Any, *operands: Expr) -> n.BoolOp:
        return n.BoolOp(op="or", operands=operands, span=self._span(meta))

    def and_test(self, meta: Any, *operands: Expr) -> n.BoolOp:
        return n.BoolOp(op="and", operands=operands, span=self._span(meta))

    def comp_op(self, meta: Any, *tokens: Token) -> str:
        return " ".join(str(t) for t in tokens)

    def add_op(self, meta: Any, token: Token) -> str:
        return str(token)

    def compare(self, meta: Any, left: Expr, op: str, right: Expr) -> n.Compare:
        return n.Compare(op=op, left=left, right=right, span=self._span(meta))

    def sum(self, meta: Any, first: Expr, *rest: Any) -> n.Arith:
        pairs = tuple((rest[i], rest[i + 1]) for i in range(0, len(rest), 2))
        return n.Arith(first=first, rest=pairs, span=self._span(meta))

    def filter(self, meta: Any, name: Token, *args: Expr) -> n.Filter:
        return n.Filter(name=str(name), args=args, span=self._span(meta))

    def pipe(self, meta: Any, value: Expr, *filters: n.Filter) -> n.Pipe:
        return n.Pipe(value=value, filters=filters, span=self._span(meta))


@v_args(inline=True)
class HoleToAst(Transformer[Token, Any]):
    """Builds the placeholder kinds of ``interpolation.lark`` (and ``condition.lark``'s start)."""

    def if_open(self, expr: Expr) -> tuple[str, Expr | None]:
        return ("if", expr)

    def else_tag(self) -> tuple[str, Expr | None]:
        return ("else", None)

    def end_if(self) -> tuple[str, Expr | None]:
        return ("end", None)

    def output(self, expr: Expr) -> tuple[str, Expr | None]:
        return ("output", expr)

    def start(self, expr: Expr) -> Expr:
        return expr


def _tree_depth(tree: Tree[Token]) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))
    return deepest


def _parse(grammar: str, source: str, inner: str, base: int, end_word: str, end_offset: int) -> Any:
    """Parse ``inner`` (which sits at ``base`` in ``source``) and build its AST."""
    parser = load_parser(grammar)
    try:
        tree = parser.parse(inner)
    except UnexpectedInput as error:
        raise _lark_problem(error, parser, inner, base, end_word, end_offset) from None
    except LarkError as error:  # pragma: no cover - defensive: any other Lark failure is a syntax issue
        raise _Problem(base, f"invalid syntax: {error}") from None
    if _tree_depth(tree) > MAX_NESTING:
        raise _Problem(
            base,
            f"expression is nested too deeply (more than MAX_NESTING={MAX_NESTING} levels); split it up",
        )
    transformer = merge_transformers(HoleToAst(), expr=ExprToAst(source, base))  # type: ignore[no-untyped-call]
    try:
        return transformer.transform(tree)
    except VisitError as error:  # pragma: no cover - the transformer only builds nodes
        raise _Problem(base, f"invalid expression: {error.orig_exc}") from None


# ---------------------------------------------------------------------------------------------
# Checks after parsing (names, arities), and source() -> Ref


def _suggest(name: str, known: Iterable[str]) -> str:
    names = sorted(known)
    hint = did_you_mean(name, names, show="'{}'".format)
    return f"{hint} Available: {', '.join(names)}"


def _constant(node: Expr) -> tuple[bool, Any]:
    if isinstance(node, n.Literal):
        return True, node.value
    if isinstance(node, n.ListExpr):
        values = [_constant(item) for item in node.items]
        return all(ok for ok, _ in values), [v for _, v in values]
    if isinstance(node, n.DictExpr):
        pairs = [(key, _constant(value)) for key, value in node.items]
        return all(ok for _, (ok, _) in pairs), {key: v for key, (_, v) in pairs}
    return False, None


def _offset(node: Any, fallback: int) -> int:
    span = getattr(node, "span", None)
    return span.start if span is not None else fallback


def _check(roots: Iterable[Any], fallback: int, *, in_leaf: bool) -> list[_Problem]:
    problems: list[_Problem] = []
    for node in n.iter_nodes(tuple(roots)):
        at = _offset(node, fallback)
        # Path segments (``__typename`` included) are only ever keys of mappings and items of
        # lists (runtime.lookup), never attributes, so no segment name needs refusing.
        if isinstance(node, n.Reserved):
            if node.name not in RESERVED_SOURCES:
                known = ", ".join(f"'{r}'" for r in sorted(RESERVED_SOURCES))
                problems.append(_Problem(at, f"unknown reserved name '{node.name}'; expected one of {known}"))
        elif isinstance(node, n.Call):
            problems.extend(_check_call(node, at, in_leaf))
        elif isinstance(node, n.Literal) and isinstance(node.value, str):
            lone = _LONE_SURROGATE.search(node.value)
            if lone is not None:
                problems.append(
                    _Problem(
                        at,
                        f"the string holds a lone surrogate (\\u{ord(lone.group()):04x}), which is not "
                        "text and cannot be written out; a \\ud800-\\udfff escape must be half of a "
                        'pair, as in "\\ud83d\\ude00"',
                    )
                )
        elif isinstance(node, n.Filter):
            spec = FILTERS.get(node.name)
            if spec is None:
                problems.append(_Problem(at, f"unknown filter '{node.name}'.{_suggest(node.name, FILTERS)}"))
            elif not spec.min_args <= len(node.args) <= spec.max_args:
                problems.append(
                    _Problem(
                        at,
                        f"filter '{node.name}' {_arity(spec.min_args, spec.max_args, len(node.args))}; use {spec.usage}",
                    )
                )
    return problems


def _arity(low: int, high: int, got: int) -> str:
    wanted = str(low) if low == high else f"{low} to {high}"
    return f"takes {wanted} argument{'s' if high != 1 else ''}, got {got}"


def _check_call(node: n.Call, at: int, in_leaf: bool) -> list[_Problem]:
    if node.name not in FUNCTIONS:
        return [_Problem(at, f"unknown function '{node.name}()'.{_suggest(node.name, FUNCTIONS)}")]
    low, high = FUNCTIONS[node.name]
    if not low <= len(node.args) <= high:
        return [_Problem(at, f"{node.name}() {_arity(low, high, len(node.args))}")]
    if node.name != "source":
        return []
    if in_leaf:
        return [
            _Problem(
                at,
                "source() reads task data and can only be used in conditions; "
                "in a leaf use a path such as {{ item.text }} or $item",
            )
        ]
    name = node.args[0]
    if not (isinstance(name, n.Literal) and isinstance(name.value, str)):
        return [_Problem(at, 'source() needs the source name as a string literal, e.g. source("turns")')]
    if len(node.args) == 2 and not _constant(node.args[1])[0]:
        return [_Problem(at, "source() args must be a literal (string, number, list or {...} mapping)")]
    return []


def _rewrite_sources(node: Any) -> Any:
    """Replace valid ``source("name", args)`` calls by :class:`Ref` nodes (depth is bounded)."""
    if isinstance(node, n.Call) and node.name == "source":
        args = freeze(_constant(node.args[1])[1]) if len(node.args) == 2 else None
        name = node.args[0]
        assert isinstance(name, n.Literal)  # checked by _check_call before any rewrite
        return n.Ref(source=name.value, args=args, span=node.span)
    if not dataclasses.is_dataclass(node) or isinstance(node, (n.Literal, n.Path, n.Reserved, n.Ref, Span)):
        return node
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, tuple):
            new = tuple(
                tuple(_rewrite_sources(x) for x in v) if isinstance(v, tuple) else _rewrite_sources(v)
                for v in value
            )
        else:
            new = _rewrite_sources(value)
        if new != value or new is not value:
            changes[f.name] = new
    return dataclasses.replace(cast(Any, node), **changes) if changes else node


def _has_source_call(root: Any) -> bool:
    return any(isinstance(x, n.Call) and x.name == "source" for x in n.iter_nodes((root,)))


# ---------------------------------------------------------------------------------------------
# Leaves


class _OpenIf:
    __slots__ = ("offset", "otherwise", "tag", "test", "then")

    def __init__(self, test: Expr, offset: int, tag: str) -> None:
        self.test = test
        self.offset = offset
        self.tag = tag
        self.then: list[Part] = []
        self.otherwise: list[Part] | None = None


def _describe_open(text: str, block: _OpenIf) -> str:
    line, column = _line_col(text, block.offset)
    return f"The innermost block that needs to be closed is '{block.tag}' (line {line}, column {column})."


def _read_leaf(text: str) -> tuple[tuple[Part, ...], bool, list[_Problem]]:
    """Split ``text`` into parts, parse placeholders, match blocks; collect every problem."""
    root: list[Part] = []
    stack: list[_OpenIf] = []
    problems: list[_Problem] = []
    current = root
    position = 0
    has_variables = False
    for match in PLACEHOLDER.finditer(text):
        has_variables = True
        if match.start() > position:
            current.append(n.Text(value=text[position : match.start()]))
        position = match.end()
        inner, base = match.group(1), match.start(1)
        # trimmed as the reference trims (JavaScript's whitespace set: U+FEFF is trimmed,
        # U+001C-U+001F and U+0085 are kept)
        stripped = inner.strip(JS_WHITESPACE)
        span_line, span_col = _line_col(text, match.start())
        span = Span(match.start(), match.end(), span_line, span_col)
        if not _is_tag(stripped) and not is_expression(stripped):
            segments = parse_path(stripped)
            current.append(n.Output(expr=n.Path(segments=segments, span=span), plain=True, span=span))
            continue
        tag = _TAG.match(stripped)
        if tag is not None and tag.group(2) != "if":
            shown = "{{" + tag.group(0) + "}}"
            message = f"unknown block tag '{shown}'; storyforge knows '{{{{#if …}}}}', '{{{{else}}}}' and '{{{{/if}}}}'."
            if stack:
                message += " " + _describe_open(text, stack[-1])
            problems.append(_Problem(match.start(), message))
            continue
        try:
            kind, expr = _parse("interpolation", text, inner, base, "'}}'", match.end(1))
            found = _check((expr,), base, in_leaf=True) if expr is not None else []
        except _Problem as problem:
            problems.append(problem)
            continue
        if found:
            problems.extend(found)
            continue
        if kind == "output":
            current.append(n.Output(expr=expr, span=span))
        elif kind == "if":
            if len(stack) >= MAX_NESTING:
                problems.append(
                    _Problem(
                        match.start(),
                        f"'{{{{#if}}}}' blocks are nested too deeply "
                        f"(more than MAX_NESTING={MAX_NESTING} levels)",
                    )
                )
                break
            block = _OpenIf(
                expr, match.start(), "{{" + stripped + "}}" if len(stripped) < 40 else "{{#if …}}"
            )
            stack.append(block)
            current = block.then
        elif kind == "else":
            if not stack:
                problems.append(
                    _Problem(match.start(), "unexpected '{{else}}' outside an '{{#if …}}' block.")
                )
            elif stack[-1].otherwise is not None:
                problems.append(
                    _Problem(
                        match.start(),
                        f"unexpected second '{{{{else}}}}'; expected '{{{{/if}}}}'. {_describe_open(text, stack[-1])}",
                    )
                )
            else:
                stack[-1].otherwise = []
                current = stack[-1].otherwise
        else:  # end
            if not stack:
                problems.append(
                    _Problem(
                        match.start(), "unexpected '{{/if}}': there is no open '{{#if …}}' block to close."
                    )
                )
                continue
            block = stack.pop()
            line, column = _line_col(text, block.offset)
            node = n.IfBlock(
                test=block.test,
                then=tuple(block.then),
                otherwise=tuple(block.otherwise) if block.otherwise is not None else None,
                span=Span(block.offset, match.end(), line, column),
            )
            current = (
                (stack[-1].otherwise if stack[-1].otherwise is not None else stack[-1].then)
                if stack
                else root
            )
            current.append(node)
    if position < len(text):
        current.append(n.Text(value=text[position:]))
    if stack and not problems:
        problems.append(
            _Problem(
                len(text),
                "unexpected end of template; storyforge was looking for '{{else}}' or '{{/if}}'. "
                + _describe_open(text, stack[-1]),
            )
        )
    return tuple(root), has_variables, problems


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large structure is built.

    Compiling a string with 100,000 placeholders creates about a million nodes and closures
    that all stay alive, and the collector's repeated passes over them made compiling grow
    faster than linearly. Nothing built while compiling is cyclic garbage (no recursive
    closures: tests/test_render_memory.py checks that compiling, rendering and dropping a
    template leaves nothing for the collector), so pausing loses nothing; reference counting
    still frees everything as usual, and the collector runs again as soon as compiling ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@lru_cache(maxsize=4096)
def _compile_leaf_cached(text: str) -> Leaf | tuple[Issue, ...]:
    if len(text) < 4096:
        return _compile_leaf_text(text)
    with gc_paused():
        return _compile_leaf_text(text)


def _compile_leaf_text(text: str) -> Leaf | tuple[Issue, ...]:
    parts, has_variables, problems = _read_leaf(text)
    if problems:
        return tuple(_issue(text, p) for p in problems)
    return Leaf(source=text, parts=parts, has_variables=has_variables, render=compile_parts(parts))


def compile_leaf(text: str, path: TemplatePath = ROOT) -> Leaf:
    """Compile a leaf string once; the result renders with ``leaf.render(scope)``.

    Raises :class:`TemplateValidationError` listing every syntax problem in the string.
    Compiled leaves are cached by text, so compiling the same string again is a lookup.
    """
    if not isinstance(text, str):
        raise TemplateValidationError(
            [Issue(code="syntax", path=path, message=f"expected a string, got {type(text).__name__}")]
        )
    result = _compile_leaf_cached(text)
    if isinstance(result, Leaf):
        return result
    raise TemplateValidationError([dataclasses.replace(issue, path=path) for issue in result])


# ---------------------------------------------------------------------------------------------
# Conditions


def parse_expression(text: str, *, in_leaf: bool = False) -> Expr:
    """Parse one expression (the condition language) to its AST; raises on syntax errors."""
    issues, expr = _read_expression(text, in_leaf=in_leaf)
    if issues:
        raise TemplateValidationError(issues)
    assert expr is not None
    return expr


def _read_expression(text: str, *, in_leaf: bool = False) -> tuple[list[Issue], Expr | None]:
    try:
        expr = _parse("condition", text, text, 0, "the end of the condition", len(text))
        problems = _check((expr,), 0, in_leaf=in_leaf)
    except _Problem as problem:
        problems = [problem]
    if problems:
        return [_issue(text, p) for p in problems], None
    if _has_source_call(expr):
        expr = _rewrite_sources(expr)
    return [], expr


def _evaluator(expr: Expr) -> Any:
    fn = compile_expr(expr)
    if isinstance(expr, (n.Compare, n.Not)) or (isinstance(expr, n.Call) and expr.name != "len"):
        return fn  # already returns a bool
    return lambda scope, resolve: truthy(fn(scope, resolve))


class _TypedKey:
    """Cache key for a frozen spec that tells ``True`` from ``1`` and ``1.0`` from ``1`` (plain
    dict equality does not, and would hand one spec's compiled condition to another)."""

    __slots__ = ("_key", "spec")

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._key = n.typed_key(spec)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TypedKey) and bool(self._key == other._key)


@lru_cache(maxsize=4096)
def _compile_condition_cached(key: Any) -> Condition | tuple[Issue, ...]:
    spec = key.spec if isinstance(key, _TypedKey) else key
    if isinstance(spec, str):
        issues, expr = _read_expression(spec)
    else:
        issues, expr = build_condition(spec)
    if issues or expr is None:
        return tuple(issues)
    return Condition(source=spec, expr=expr, evaluate=_evaluator(expr))


@lru_cache(maxsize=4096)
def _compile_condition_image(image: bytes) -> Condition | tuple[Issue, ...]:
    """:func:`_compile_condition_cached` for a mapping spec given as its marshal image."""
    return _compile_condition_cached.__wrapped__(_TypedKey(freeze(marshal.loads(image))))


def compile_condition(spec: Mapping[str, Any] | str, path: TemplatePath = ROOT) -> Condition:
    """Compile a ``when:`` condition: a structured mapping (``{"type": "nonEmpty", "ref": …}``)
    or a string expression (``"len(turns) > 2 and ctx.model == 'llama3'"``).

    Both compile to the same AST. The spec is deep-copied (frozen), so later changes to the
    caller's mapping never reach the condition. Raises :class:`TemplateValidationError`.
    """
    if spec.__class__ is dict:
        # Plain data (a normalised document's condition): its marshal image is the cache key,
        # which tells types apart as _TypedKey does, without freezing the spec first. Version 2
        # writes no back-references, so equal specs give equal images whichever objects they share.
        try:
            image = marshal.dumps(spec, 2)
        except ValueError:  # something marshal does not write (a subclass, an object)
            image = None
        if image is not None:
            result = _compile_condition_image(image)
            if isinstance(result, Condition):
                return result
    if isinstance(spec, Mapping):
        key: Any = _TypedKey(freeze(spec))
    elif isinstance(spec, str):
        key = spec
    else:
        raise TemplateValidationError(
            [
                Issue(
                    code="schema",
                    path=path,
                    message=f'a condition must be a mapping such as {{"type": "exists", "ref": {{"source": "x"}}}} '
                    f"or a string expression, got {type(spec).__name__}",
                )
            ]
        )
    try:
        result = _compile_condition_cached(key)
    except TypeError:  # an unhashable value inside the spec: compile without the cache
        result = _compile_condition_cached.__wrapped__(key)
    if isinstance(result, Condition):
        return result
    raise TemplateValidationError(
        [dataclasses.replace(issue, path=TemplatePath((*path, *issue.path))) for issue in result]
    )
