"""Expression and leaf evaluation: parsed nodes -> closures, built once at compile time.

Takes: expression nodes and leaf parts (:mod:`storyforge.engine.nodes`) from the parser. Gives:
:func:`compile_expr` (an :data:`Evaluator`, ``fn(scope, resolve)``), :func:`compile_hole` (the
text of one ``{{…}}`` placeholder), :func:`compile_parts` (``render(scope, depth) -> (text,
contentful)`` for a whole leaf, specialised by its shape), :func:`path_getter`,
:func:`expand` (a string from data as rendered, §5.5) and
:data:`FUNCTIONS` (the functions callable in expressions).

Why: compiled templates are frozen closures, never generated source (no eval/exec). Every
rule about values comes from :mod:`storyforge.engine.runtime` and every transformation from
:mod:`storyforge.engine.filters`; this module only decides, once per leaf, which of them run on
each render, so the per-render work is a few closure calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from storyforge.engine import nodes as n
from storyforge.engine.filters import FILTERS
from storyforge.engine.runtime import (
    EXPANDS,
    JS_WHITESPACE,
    MAX_RENDER_CHARS,
    Scope,
    arithmetic,
    check_output_size,
    compare_numbers,
    contains,
    deep_equal,
    expand,
    is_contentful,
    length,
    lookup,
    lookup_scope,
    negate,
    non_empty,
    resolve_reserved,
    to_text,
    truthy,
)
from storyforge.engine.sources import MISSING

__all__ = [
    "FUNCTIONS",
    "Emitter",
    "Evaluator",
    "HoleFn",
    "compile_expr",
    "compile_filters",
    "compile_hole",
    "compile_parts",
    "expand",
    "path_getter",
]

Evaluator = Callable[[Scope, Any], Any]
"""``fn(scope, resolve)``: the value of an expression; ``resolve`` is ``None`` inside leaves."""

HoleFn = Callable[[Scope, int], str]
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
    if isinstance(node, n.Literal):
        value = node.value
        return lambda scope, resolve: value
    if isinstance(node, n.Path):
        get = path_getter(node.segments)
        return lambda scope, resolve: get(scope)
    if isinstance(node, n.Reserved):
        return _reserved_evaluator(node.name, node.segments)
    if isinstance(node, n.Ref):
        raw = _raw_ref(node)

        def read(scope: Scope, resolve: Any) -> Any:
            value = raw(scope, resolve)
            return None if value is MISSING else value

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
        return _compare(node.op, _operand(node.left, node.op), _operand(node.right, node.op))
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


def _raw_ref(node: n.Ref) -> Evaluator:
    """A DataRef read that keeps :data:`MISSING` (absent) apart from ``None`` (null)."""
    source, args = node.source, node.args

    def read(scope: Scope, resolve: Any) -> Any:
        if resolve is None:
            return resolve_reserved(source, args, scope, MISSING)
        return resolve(source, args)

    return read


def _operand(node: Any, op: str) -> Evaluator:
    """An operand of a comparison: ``==``/``!=`` see a DataRef's absence (decision #20)."""
    if op in ("==", "!=") and isinstance(node, n.Ref):
        return _raw_ref(node)
    return compile_expr(node)


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


FUNCTIONS: Final[Mapping[str, tuple[int, int]]] = {
    "len": (1, 1),
    "exists": (1, 1),
    "nonEmpty": (1, 1),
    "source": (1, 2),
}
"""Functions callable in expressions, with their (min, max) argument counts."""


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
    if isinstance(node, n.Path):
        segments = node.segments
        get = path_getter(segments)
        if segments == ("item",):

            def item_hole(scope: Scope, depth: int) -> str:
                value = scope.item
                if value.__class__ is str:  # expand()'s own test first: most strings do not expand
                    return value if EXPANDS not in value else expand(value, scope, depth)
                return to_text(value)

            return item_hole
        if len(segments) == 1 and segments[0] not in ("item", "ctx"):
            key = segments[0]

            def plain_key(scope: Scope, depth: int) -> str:
                ctx = scope.ctx
                value = ctx[key] if ctx.__class__ is dict and key in ctx else get(scope)
                cls = value.__class__
                if cls is str:
                    return value if EXPANDS not in value else expand(value, scope, depth)
                return int.__repr__(value) if cls is int else to_text(value)  # to_text's int, inline

            return plain_key

        def plain(scope: Scope, depth: int) -> str:
            value = get(scope)
            return expand(value, scope, depth) if value.__class__ is str else to_text(value)

        return plain
    head = compile_expr(node.value if isinstance(node, n.Pipe) else node)
    stages = compile_filters(node.filters) if isinstance(node, n.Pipe) else ()

    def hole(scope: Scope, depth: int) -> str:
        value = head(scope, None)
        if isinstance(value, str):
            value = expand(value, scope, depth)
        for fn, args in stages:
            value = fn(value, *[arg(scope, None) for arg in args])
        return to_text(value)

    return hole


Emitter = Callable[[Scope, int, list[str], list[int]], bool]
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

    # The literal text between placeholders is joined once here; a render joins it with the
    # placeholders' texts in one list (str.format would parse a pattern on every call).
    literals = [""]
    hole_fns: list[HoleFn] = []
    for p in parts:
        if isinstance(p, n.Text):
            literals[-1] += p.value
        else:
            hole_fns.append(compile_hole(p.expr))
            literals.append("")
    first = literals[0]
    steps = tuple(zip(hole_fns, literals[1:], strict=True))
    literal_size = sum(map(len, literals))

    def render_many(scope: Scope, depth: int = 0) -> tuple[str, bool]:
        texts = [first]
        size = literal_size
        contentful = False
        for hole, after in steps:
            text = hole(scope, depth)
            size += len(text)
            if size > MAX_RENDER_CHARS:
                check_output_size(size)
            if not contentful and text.strip(JS_WHITESPACE):
                contentful = True
            texts.append(text)
            texts.append(after)
        return "".join(texts), contentful

    return render_many
