"""Hypothesis strategies shared by the test suite.

JSON-like values and render contexts, leaf strings built from template-ish fragments (so
generated inputs hit placeholders, filters, blocks and malformed braces far more often than
uniform text does), condition strings, and expression ASTs for parse/unparse round trips.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from storyforge.engine import nodes as n

__all__ = [
    "condition_texts",
    "contexts",
    "expressions",
    "json_values",
    "leaf_texts",
    "names",
    "scopes",
    "shallow_json_values",
]

names = st.sampled_from(["a", "b", "name", "items", "item", "ctx", "globals", "title", "n", "x"])
"""Short keys that generated paths and contexts share, so lookups often hit."""

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """JSON-like data with up to about ``max_leaves`` scalars: scalars (NaN and infinities
    included), lists and string-keyed dicts, nested to any depth."""
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(names, st.text(max_size=6)), inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def shallow_json_values(depth: int = 2) -> st.SearchStrategy[Any]:
    """JSON-like data at most ``depth`` containers deep; much cheaper to draw than
    :func:`json_values`, for properties that need many examples."""
    values: st.SearchStrategy[Any] = scalars
    for _ in range(depth):
        values = st.one_of(
            scalars,
            st.lists(values, max_size=3),
            st.dictionaries(st.one_of(names, st.text(max_size=4)), values, max_size=3),
        )
    return values


def contexts() -> st.SearchStrategy[dict[str, Any]]:
    """Render contexts keyed by :data:`names`, sometimes with ``globals``."""
    return st.dictionaries(names, shallow_json_values(2), max_size=4)


def scopes() -> st.SearchStrategy[Any]:
    """:class:`storyforge.engine.runtime.Scope` values with an item and up to two loop frames."""
    from storyforge.engine.runtime import Scope

    @st.composite
    def build(draw: st.DrawFn) -> Scope:
        scope = Scope(draw(contexts()), draw(shallow_json_values(1)))
        for i in range(draw(st.integers(0, 2))):
            scope = scope.push(draw(shallow_json_values(1)), i)
        return scope

    return build()


_FRAGMENTS = [
    "{{",
    "}}",
    "{",
    "}",
    " ",
    "\n",
    "x",
    "name",
    "item",
    "a.b",
    "[0]",
    "[",
    "]",
    ".",
    "|",
    "upper",
    'join(", ")',
    'default("n/a")',
    'bullets("- ")',
    "numbered",
    "#if ",
    "else",
    "/if",
    "$index",
    "$item",
    "$parent",
    " + 1",
    " and ",
    " or ",
    "not ",
    " == ",
    " in ",
    "(",
    ")",
    '"',
    "'",
    "len(",
    "__class__",
    "-",
    ",",
    "0",
    "1.5",
    "true",
    "null",
    "#each",
    "{{#if a}}",
    "{{else}}",
    "{{/if}}",
    "{{ x | upper }}",
    "{{item}}",
    "{{ }}",
    "\\",
    "é",
    "\t",
]


def leaf_texts() -> st.SearchStrategy[str]:
    """Strings assembled from template fragments, mixed with arbitrary text."""
    return st.one_of(
        st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join),
        st.text(max_size=40),
        st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=3)), max_size=10).map("".join),
    )


_CONDITION_FRAGMENTS = [
    "a",
    "b.c",
    "len(",
    "items",
    ")",
    "(",
    " > ",
    " < ",
    " == ",
    " != ",
    " and ",
    " or ",
    "not ",
    " in ",
    "[",
    "]",
    ",",
    "1",
    "2.5",
    "'x'",
    '"y"',
    "true",
    "null",
    "$item",
    "$index",
    "exists(",
    "nonEmpty(",
    'source("s")',
    "{",
    "}",
    ":",
    " | length",
    " + ",
    " - ",
    "-",
    "__x",
    "$nope",
]


def condition_texts() -> st.SearchStrategy[str]:
    """String conditions assembled from expression fragments, mixed with arbitrary text."""
    return st.one_of(
        st.lists(st.sampled_from(_CONDITION_FRAGMENTS), max_size=12).map("".join),
        st.text(max_size=30),
    )


# Expression ASTs (without spans) for parse(unparse(node)) == node.

_path_segments = st.one_of(
    st.from_regex(r"[A-Za-z0-9_]{1,6}", fullmatch=True),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=5),
).filter(lambda s: not s.startswith("__"))
_path_heads = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True).filter(
    lambda s: s not in {"and", "or", "not", "in", "true", "false", "null", "else"} and not s.startswith("__")
)
_literal_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=0, max_value=10**9),
    st.floats(min_value=0, max_value=1e300, allow_nan=False, allow_infinity=False),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
)

_atoms: st.SearchStrategy[Any] = st.one_of(
    _literal_values.map(lambda v: n.Literal(value=v)),
    st.builds(lambda h, r: n.Path(segments=(h, *r)), _path_heads, st.lists(_path_segments, max_size=3)),
    st.builds(
        lambda name, r: n.Reserved(name=name, segments=tuple(r)),
        st.sampled_from(["$item", "$index", "$parent", "$globals", "$ctx"]),
        st.lists(_path_segments, max_size=2),
    ),
)


def _compound(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda o: n.Not(operand=o), inner),
        st.builds(lambda o: n.Neg(operand=o), inner),
        st.builds(
            lambda op, xs: n.BoolOp(op=op, operands=tuple(xs)),
            st.sampled_from(["and", "or"]),
            st.lists(inner, min_size=2, max_size=3),
        ),
        st.builds(
            lambda op, a, b: n.Compare(op=op, left=a, right=b),
            st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "not in"]),
            inner,
            inner,
        ),
        st.builds(
            lambda first, rest: n.Arith(first=first, rest=tuple(rest)),
            inner,
            st.lists(st.tuples(st.sampled_from(["+", "-"]), inner), min_size=1, max_size=3),
        ),
        st.builds(
            lambda name, a: n.Call(name=name, args=(a,)),
            st.sampled_from(["len", "exists", "nonEmpty"]),
            inner,
        ),
        st.builds(lambda xs: n.ListExpr(items=tuple(xs)), st.lists(inner, max_size=3)),
        st.builds(
            lambda v, fs: n.Pipe(value=v, filters=tuple(fs)),
            inner,
            st.lists(
                st.one_of(
                    st.sampled_from(["upper", "lower", "trim", "length", "first", "last", "json"]).map(
                        lambda name: n.Filter(name=name)
                    ),
                    st.builds(lambda a: n.Filter(name="join", args=(a,)), inner),
                    st.builds(lambda a: n.Filter(name="default", args=(a,)), inner),
                ),
                min_size=1,
                max_size=2,
            ),
        ),
    )


def expressions() -> st.SearchStrategy[Any]:
    """Expression ASTs of bounded depth, as the condition grammar would build them."""
    return st.recursive(_atoms, _compound, max_leaves=8)
