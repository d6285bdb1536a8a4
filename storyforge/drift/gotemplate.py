"""Go's ``text/template``, the subset Ollama's TEMPLATE uses, as a parser and an interpreter.

Takes: template text. Gives: :func:`parse` -> :class:`Template` (a frozen node tree) with
:meth:`Template.execute` (data -> text), :meth:`Template.fields` (every field name used, as
Ollama's ``Vars()`` collects them) and :meth:`Template.cut_after` (the tree up to the first
use of a field, as Ollama cuts its last turn after ``.Response``).

Why: Ollama builds the prompt with this language, not Jinja, so the serving side of an Ollama
model can only be known by executing its TEMPLATE. The template is data: it is parsed into
nodes and interpreted; nothing in it is ever evaluated as Python.

The subset: text; ``{{- … -}}`` whitespace trimming; comments; ``if``/``else if``/``else``,
``range`` (with ``$i, $v :=``), ``with`` and ``end``; variables (``$x := …``, ``$x = …``,
``$``); fields (``.Role``, ``$.System``, ``$m.Content``); string, number and boolean
literals; parentheses and pipes; the functions ``eq ne lt le gt ge and or not len index
slice print``. Anything else is a :class:`GoTemplateError` naming the line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from storyforge.errors import DataError

__all__ = ["MAX_OUTPUT", "MAX_STEPS", "GoTemplateError", "GoTemplateLimit", "Template", "parse"]

#: Execution bounds: characters of output (and of any string a function builds), and nodes run.
MAX_OUTPUT = 1 << 20
MAX_STEPS = 1_000_000


class GoTemplateError(DataError):
    """A TEMPLATE that cannot be parsed or executed; names the line."""


class GoTemplateLimit(GoTemplateError):
    """A TEMPLATE stopped at :data:`MAX_OUTPUT` or :data:`MAX_STEPS` (not a finding: the
    gate could not run)."""


# -- nodes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    base: Any  # None = dot, str = variable name ("$" for the root), Pipe = parenthesised
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any


@dataclass(frozen=True, slots=True)
class Ident:
    name: str


@dataclass(frozen=True, slots=True)
class Pipe:
    commands: tuple[tuple[Any, ...], ...]
    declare: tuple[str, ...] = ()
    assign: bool = False  # ``=`` instead of ``:=``


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Action:
    pipe: Pipe
    line: int


@dataclass(frozen=True, slots=True)
class Block:
    kind: str  # if, range, with
    pipe: Pipe
    body: tuple[Any, ...]
    orelse: tuple[Any, ...]
    line: int


# -- lexing -----------------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<var>\$[A-Za-z_0-9]*)
    | (?P<field>(?:\.[A-Za-z_][A-Za-z_0-9]*)+)
    | (?P<dot>\.)
    | (?P<decl>:=)
    | (?P<punct>[()|,=])
    | (?P<ident>[A-Za-z_][A-Za-z_0-9]*)
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def _lex(source: str, line: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(source):
        if not source[pos:].strip():
            break
        match = _TOKEN.match(source, pos)
        if match is None or match.end() == pos:
            raise GoTemplateError(
                f"TEMPLATE line {line}: unexpected {source[pos:].strip()[:20]!r} in an action"
            )
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text[1:-1])


# -- parsing ----------------------------------------------------------------------------------


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], line: int) -> None:
        self.tokens = tokens
        self.pos = 0
        self.line = line

    def fail(self, message: str) -> GoTemplateError:
        return GoTemplateError(f"TEMPLATE line {self.line}: {message}")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise self.fail("the action ends too early")
        self.pos += 1
        return token

    def pipe(self, *, allow_decl: bool = True) -> Pipe:
        declare: list[str] = []
        assign = False
        if allow_decl:
            save = self.pos
            names: list[str] = []
            while (t := self.peek()) is not None and t[0] == "var":
                names.append(self.take()[1])
                if self.peek() == ("punct", ","):
                    self.take()
                    continue
                break
            t = self.peek()
            if names and t is not None and (t[0] == "decl" or t == ("punct", "=")):
                self.take()
                declare, assign = names, t[0] != "decl"
            else:
                self.pos = save
        commands = [self.command()]
        while self.peek() == ("punct", "|"):
            self.take()
            commands.append(self.command())
        return Pipe(commands=tuple(commands), declare=tuple(declare), assign=assign)

    def command(self) -> tuple[Any, ...]:
        operands = []
        while (t := self.peek()) is not None and t not in (("punct", "|"), ("punct", ")")):
            operands.append(self.operand())
        if not operands:
            raise self.fail("an empty command")
        return tuple(operands)

    def operand(self) -> Any:
        kind, text = self.take()
        if kind == "str":
            return Literal(_unescape(text))
        if kind == "raw":
            return Literal(text[1:-1])
        if kind == "num":
            return Literal(float(text) if "." in text else int(text))
        if kind == "dot":
            return Field(None, ())
        if kind == "field":
            return Field(None, tuple(text[1:].split(".")))
        if kind == "var":
            names: tuple[str, ...] = ()
            if (t := self.peek()) is not None and t[0] == "field":
                names = tuple(self.take()[1][1:].split("."))
            return Field(text, names)
        if kind == "ident":
            if text in ("true", "false"):
                return Literal(text == "true")
            if text == "nil":
                return Literal(None)
            if text not in _FUNCTIONS and text not in ("and", "or"):
                raise self.fail(
                    f"function {text!r} is not known (known: and, or, {', '.join(sorted(_FUNCTIONS))})"
                )
            return Ident(text)
        if (kind, text) == ("punct", "("):
            inner = self.pipe()
            if self.take() != ("punct", ")"):
                raise self.fail("a '(' is not closed")
            names = ()
            if (t := self.peek()) is not None and t[0] == "field":
                names = tuple(self.take()[1][1:].split("."))
            return Field(inner, names)
        raise self.fail(f"unexpected {text!r}")


def parse(text: str) -> Template:
    """Parse Go template ``text``; :class:`GoTemplateError` names the line of a problem."""
    items: list[tuple[str, Any, int]] = []  # ("text", str) / ("action", body, line)
    pos = 0
    for match in _ACTION.finditer(text):
        chunk = text[pos : match.start()]
        if match.group(1):
            chunk = chunk.rstrip()
        items.append(("text", chunk, 0))
        items.append(("action", match.group(2), text.count("\n", 0, match.start()) + 1))
        items.append(("trim", bool(match.group(3)), 0))
        pos = match.end()
    items.append(("text", text[pos:], 0))
    # apply right-trims to the text that follows
    flat: list[tuple[str, Any, int]] = []
    trim_next = False
    for kind, value, line in items:
        if kind == "trim":
            trim_next = value
            continue
        if kind == "text" and trim_next:
            value = value.lstrip()
        trim_next = False
        flat.append((kind, value, line))
    nodes, _, _ = _parse_list(flat, 0, top=True)
    return Template(nodes=tuple(nodes))


_MAX_DEPTH = 100


def _parse_list(
    items: list[tuple[str, Any, int]], i: int, *, top: bool, depth: int = 0
) -> tuple[list[Any], int, str]:
    """Nodes until ``end``/``else``; returns them, the next index and what stopped them."""
    if depth > _MAX_DEPTH:
        raise GoTemplateError(f"TEMPLATE: blocks nested deeper than {_MAX_DEPTH}")
    nodes: list[Any] = []
    while i < len(items):
        kind, value, line = items[i]
        i += 1
        if kind == "text":
            if value:
                nodes.append(Text(value))
            continue
        body = value.strip()
        if body.startswith("/*"):
            continue
        tokens = _lex(body, line)
        if not tokens:
            raise GoTemplateError(f"TEMPLATE line {line}: an empty action {{{{ }}}}")
        head = tokens[0]
        if head == ("ident", "end"):
            if top:
                raise GoTemplateError(f"TEMPLATE line {line}: {{{{ end }}}} without an open block")
            return nodes, i, "end"
        if head == ("ident", "else"):
            if top:
                raise GoTemplateError(f"TEMPLATE line {line}: {{{{ else }}}} without an open block")
            if len(tokens) > 1 and tokens[1] == ("ident", "if"):
                # ``else if X`` is ``else`` holding one ``if X`` whose end is the outer end
                return nodes, i - 1, "elseif"
            return nodes, i, "else"
        if head[0] == "ident" and head[1] in ("if", "range", "with"):
            parser = _Parser(tokens[1:], line)
            pipe = parser.pipe()
            if parser.peek() is not None:
                raise parser.fail("unexpected text after the pipeline")
            block, i = _parse_block(items, i, head[1], pipe, line, depth + 1)
            nodes.append(block)
            continue
        parser = _Parser(tokens, line)
        pipe = parser.pipe()
        if parser.peek() is not None:
            raise parser.fail(f"unexpected {parser.peek()[1]!r}")  # type: ignore[index]
        nodes.append(Action(pipe, line))
    if not top:
        raise GoTemplateError("TEMPLATE: a block is not closed with {{ end }}")
    return nodes, i, "eof"


def _parse_block(
    items: list[tuple[str, Any, int]], i: int, kind: str, pipe: Pipe, line: int, depth: int
) -> tuple[Block, int]:
    body, i, stop = _parse_list(items, i, top=False, depth=depth)
    orelse: list[Any] = []
    if stop == "else":
        orelse, i, stop = _parse_list(items, i, top=False, depth=depth)
        if stop != "end":
            raise GoTemplateError(f"TEMPLATE line {line}: expected {{{{ end }}}} after {{{{ else }}}}")
    elif stop == "elseif":
        _, value, else_line = items[i]
        tokens = _lex(value.strip(), else_line)[2:]
        parser = _Parser(tokens, else_line)
        inner_pipe = parser.pipe()
        inner, i = _parse_block(items, i + 1, "if", inner_pipe, else_line, depth + 1)
        orelse = [inner]
    return Block(kind, pipe, tuple(body), tuple(orelse), line), i


# -- execution --------------------------------------------------------------------------------


def _truth(value: Any) -> bool:
    return bool(value) if value is not None else False


def _eq(a: Any, *others: Any) -> bool:
    return any(a == b for b in others)


def _slice(value: Any, *bounds: int) -> Any:
    return value[bounds[0] : bounds[1]] if len(bounds) > 1 else value[bounds[0] :] if bounds else value


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "eq": _eq,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "not": lambda a: not _truth(a),
    "len": lambda a: len(a),
    "index": lambda a, *keys: _index(a, keys),
    "slice": _slice,
    "print": lambda *a: "".join(_text(x) for x in a),
}


def _index(value: Any, keys: Sequence[Any]) -> Any:
    for key in keys:
        value = value[key]
    return value


def _text(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class Template:
    nodes: tuple[Any, ...]

    def execute(self, data: Mapping[str, Any]) -> str:
        """The text for ``data``; :class:`GoTemplateError` when it would exceed
        :data:`MAX_OUTPUT` characters or :data:`MAX_STEPS` steps."""
        out: list[str] = []
        _Exec(data).run(self.nodes, data, [{"$": data}], out)
        return "".join(out)

    def fields(self) -> frozenset[str]:
        """Every field name the template uses (``Messages``, ``System``, ``Response`` …)."""
        found: set[str] = set()
        for node in _walk(self.nodes):
            if isinstance(node, Field):
                found.update(node.names)
        return frozenset(found)

    def cut_after(self, name: str) -> Template:
        """The tree up to and including the first node that uses field ``name``, in document
        order; everything after it is dropped (Ollama's cut after ``.Response``)."""
        kept, _ = _cut(self.nodes, name)
        return Template(nodes=tuple(kept))


def _walk(node: Any) -> Any:
    if isinstance(node, tuple | list):
        for child in node:
            yield from _walk(child)
    elif isinstance(node, Block):
        yield from _walk(node.pipe)
        yield from _walk(node.body)
        yield from _walk(node.orelse)
    elif isinstance(node, Action):
        yield from _walk(node.pipe)
    elif isinstance(node, Pipe):
        for command in node.commands:
            yield from _walk(command)
    elif isinstance(node, Field):
        yield node
        if isinstance(node.base, Pipe):
            yield from _walk(node.base)


def _uses(node: Any, name: str) -> bool:
    return any(isinstance(n, Field) and name in n.names for n in _walk(node))


def _cut(nodes: Sequence[Any], name: str) -> tuple[list[Any], bool]:
    kept: list[Any] = []
    for node in nodes:
        if isinstance(node, Block) and not _uses(node.pipe, name):
            body, found = _cut(node.body, name)
            orelse: list[Any] = list(node.orelse)
            if not found:
                orelse, found = _cut(node.orelse, name)
            else:
                orelse = []
            kept.append(replace(node, body=tuple(body), orelse=tuple(orelse)))
            if found:
                return kept, True
            continue
        kept.append(node)
        if _uses(node, name):
            return kept, True
    return kept, False


class _Exec:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.steps = 0
        self.size = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise GoTemplateLimit(f"TEMPLATE: execution took more than {MAX_STEPS} steps (limit)")

    def emit(self, out: list[str], text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise GoTemplateLimit(f"TEMPLATE: the output exceeds {MAX_OUTPUT} characters (limit)")
        out.append(text)

    def run(self, nodes: Sequence[Any], dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
        for node in nodes:
            self.tick()
            if isinstance(node, Text):
                self.emit(out, node.text)
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot, scopes, node.line)
                if not node.pipe.declare:
                    self.emit(out, _text(value))
            else:
                self.block(node, dot, scopes, out)

    def block(self, node: Block, dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
        scopes = [*scopes, {}]
        if node.kind == "range":
            value = self.pipe(replace(node.pipe, declare=()), dot, scopes, node.line)
            items: Any
            if isinstance(value, Mapping):
                items = list(value.items())
            elif isinstance(value, list | tuple) or value is None:
                items = list(enumerate(value or ()))
            elif isinstance(value, int) and not isinstance(value, bool):
                items = ((i, i) for i in range(value)) if value > 0 else ()  # Go 1.22: range over an int
            else:
                raise GoTemplateError(
                    f"TEMPLATE line {node.line}: range can't iterate over {_text(value)[:40]!r}"
                )
            empty = True
            for key, item in items:
                self.tick()
                empty = False
                inner = [*scopes, {}]
                names = node.pipe.declare
                if len(names) == 1:
                    inner[-1][names[0]] = item
                elif len(names) == 2:
                    inner[-1][names[0]], inner[-1][names[1]] = key, item
                self.run(node.body, item, inner, out)
            if empty:
                self.run(node.orelse, dot, scopes, out)
            return
        value = self.pipe(node.pipe, dot, scopes, node.line)
        if _truth(value):
            self.run(node.body, value if node.kind == "with" else dot, scopes, out)
        else:
            self.run(node.orelse, dot, scopes, out)

    def pipe(self, pipe: Pipe, dot: Any, scopes: list[dict[str, Any]], line: int) -> Any:
        value: Any = None
        for index, command in enumerate(pipe.commands):
            value = self.command(command, dot, scopes, line, value if index else _NOTHING)
        if pipe.declare:
            if pipe.assign:
                for scope in reversed(scopes):
                    if pipe.declare[0] in scope:
                        scope[pipe.declare[0]] = value
                        break
                else:
                    raise GoTemplateError(f"TEMPLATE line {line}: undefined variable {pipe.declare[0]}")
            else:
                scopes[-1][pipe.declare[0]] = value
        return value

    def command(
        self, command: tuple[Any, ...], dot: Any, scopes: list[dict[str, Any]], line: int, piped: Any
    ) -> Any:
        head = command[0]
        if isinstance(head, Ident):
            args = [self.operand(a, dot, scopes, line) for a in command[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            if head.name in ("and", "or"):
                result = args[0]
                for arg in args[1:]:
                    if (head.name == "and") != _truth(result):
                        break
                    result = arg
                return result
            self.tick()
            if head.name == "print" and sum(len(_text(a)) for a in args) > MAX_OUTPUT:
                raise GoTemplateLimit(
                    f"TEMPLATE line {line}: print would build more than {MAX_OUTPUT} characters (limit)"
                )
            try:
                return _FUNCTIONS[head.name](*args)
            except (TypeError, IndexError, KeyError, ValueError) as exc:
                raise GoTemplateError(f"TEMPLATE line {line}: {head.name}: {exc}") from None
        if len(command) > 1 or piped is not _NOTHING:
            raise GoTemplateError(f"TEMPLATE line {line}: only a function can take arguments")
        return self.operand(head, dot, scopes, line)

    def operand(self, node: Any, dot: Any, scopes: list[dict[str, Any]], line: int) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Ident):
            return self.command((node,), dot, scopes, line, _NOTHING)
        if isinstance(node.base, Pipe):
            value = self.pipe(node.base, dot, scopes, line)
        elif node.base is None:
            value = dot
        else:
            for scope in reversed(scopes):
                if node.base in scope:
                    value = scope[node.base]
                    break
            else:
                raise GoTemplateError(f"TEMPLATE line {line}: undefined variable {node.base}")
        for name in node.names:
            if not isinstance(value, Mapping):
                raise GoTemplateError(f"TEMPLATE line {line}: cannot read field {name} of {_text(value)!r}")
            value = value.get(name)
        return value


_NOTHING = object()
