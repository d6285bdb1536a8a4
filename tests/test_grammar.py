"""The .lark grammars: loading, rule-by-rule parse tables, precedence, and parse/unparse round trips."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from pytest import param
from strategies import expressions

from storyforge.engine import grammar
from storyforge.engine import nodes as n
from storyforge.engine.nodes import (
    Arith,
    BoolOp,
    Call,
    Compare,
    DictExpr,
    Filter,
    IfBlock,
    ListExpr,
    Literal,
    Neg,
    Not,
    Output,
    Path,
    Pipe,
    Ref,
    Reserved,
    Text,
    iter_nodes,
    unparse,
)
from storyforge.engine.parser import compile_leaf, parse_expression, split_path_token
from storyforge.errors import TemplateValidationError


def lit(value: Any) -> Literal:
    return Literal(value=value)


def path(*segments: str) -> Path:
    return Path(segments=segments)


@pytest.mark.parametrize("name", grammar.GRAMMAR_NAMES)
def test_grammar_files_open_with_a_header(name: str) -> None:
    """Each grammar file starts with a comment header naming what it parses and examples."""
    text = (grammar.grammar_dir() / f"{name}.lark").read_text(encoding="utf-8")
    header = text.split("\n\n")[0]
    assert header.startswith(f"// {name}.lark:")
    assert "Example" in text.split("\n%")[0]


def test_parsers_load_once() -> None:
    """load_parser builds each LALR parser once and then returns the same object."""
    assert grammar.load_parser("condition") is grammar.load_parser("condition")
    assert grammar.load_parser("interpolation").options.parser == "lalr"
    with pytest.raises(ValueError, match="unknown grammar"):
        grammar.load_parser("nope")


def test_grammar_dir_is_the_repository_folder_in_a_checkout() -> None:
    """In a source checkout the grammar folder is <repo>/grammar (or the packaged copy)."""
    assert grammar.grammar_dir().name in {"grammar", "_grammar"}
    assert (grammar.grammar_dir() / "common.lark").is_file()


# -- expression rules (condition.lark start: pipeline) --------------------------------------------------

EXPRESSIONS = [
    # atoms
    param("42", lit(42), id="int"),
    param("2.5", lit(2.5), id="float"),
    param("1e3", lit(1000.0), id="exponent"),
    param('"a\\"b\\n\\u00e9"', lit('a"b\né'), id="double-quoted-escapes"),
    param("'it\\'s'", lit("it's"), id="single-quoted"),
    param("true", lit(True), id="true"),
    param("false", lit(False), id="false"),
    param("null", lit(None), id="null"),
    param("android", path("android"), id="keyword-prefix-is-a-name"),
    param("a.b.0", path("a", "b", "0"), id="dotted"),
    param("a[0].b", path("a", "0", "b"), id="bracket"),
    param("a.[0]", path("a", "0"), id="dot-bracket"),
    param("dims[beam.m]", path("dims", "beam.m"), id="verbatim-bracket"),
    param("a[my key]", path("a", "my key"), id="bracket-with-space"),
    param('a["x]y"]', path("a", "x]y"), id="quoted-bracket"),
    param("a['q']", path("a", "q"), id="single-quoted-bracket"),
    param("x.[]", path("x", ""), id="empty-bracket"),
    param("$item", Reserved(name="$item"), id="reserved"),
    param("$parent.title[0]", Reserved(name="$parent", segments=("title", "0")), id="reserved-path"),
    param("[1, 'a', [],]", ListExpr(items=(lit(1), lit("a"), ListExpr(items=()))), id="list-trailing-comma"),
    param(
        '{"k": 1, "j": [true]}',
        DictExpr(items=(("k", lit(1)), ("j", ListExpr(items=(lit(True),))))),
        id="dict",
    ),
    param("len(x)", Call(name="len", args=(path("x"),)), id="call"),
    param('source("t")', Ref(source="t"), id="source-call-is-ref"),
    param('source("t", {"n": [1]})', Ref(source="t", args={"n": (1,)}), id="source-with-args"),
    # operators
    param("-x", Neg(operand=path("x")), id="negation"),
    param("not x", Not(operand=path("x")), id="not"),
    param("a + 1 - b", Arith(first=path("a"), rest=(("+", lit(1)), ("-", path("b")))), id="arith-flat"),
    param("a == 1", Compare(op="==", left=path("a"), right=lit(1)), id="eq"),
    param("a != 1", Compare(op="!=", left=path("a"), right=lit(1)), id="neq"),
    param("a <= 1", Compare(op="<=", left=path("a"), right=lit(1)), id="le"),
    param("a >= 1", Compare(op=">=", left=path("a"), right=lit(1)), id="ge"),
    param("a in b", Compare(op="in", left=path("a"), right=path("b")), id="in"),
    param("a not in b", Compare(op="not in", left=path("a"), right=path("b")), id="not-in"),
    param("a and b and c", BoolOp(op="and", operands=(path("a"), path("b"), path("c"))), id="and-flat"),
    param("x | upper", Pipe(value=path("x"), filters=(Filter(name="upper"),)), id="filter"),
    param(
        'x | join(", ") | upper',
        Pipe(value=path("x"), filters=(Filter(name="join", args=(lit(", "),)), Filter(name="upper"))),
        id="filter-chain",
    ),
    # precedence
    param(
        "a or b and not c == d + 1",
        BoolOp(
            op="or",
            operands=(
                path("a"),
                BoolOp(
                    op="and",
                    operands=(
                        path("b"),
                        Not(
                            operand=Compare(
                                op="==", left=path("c"), right=Arith(first=path("d"), rest=(("+", lit(1)),))
                            )
                        ),
                    ),
                ),
            ),
        ),
        id="precedence-ladder",
    ),
    param(
        "(a or b) and c",
        BoolOp(op="and", operands=(BoolOp(op="or", operands=(path("a"), path("b"))), path("c"))),
        id="parentheses",
    ),
    param(
        "a or b | default(1)",
        Pipe(
            value=BoolOp(op="or", operands=(path("a"), path("b"))),
            filters=(Filter(name="default", args=(lit(1),)),),
        ),
        id="filter-is-loosest",
    ),
    param(
        "-a + b",
        Arith(first=Neg(operand=path("a")), rest=(("+", path("b")),)),
        id="unary-minus-binds-tight",
    ),
    param("((((x))))", path("x"), id="redundant-parentheses"),
    param("  a\n  ==\n  1  ", Compare(op="==", left=path("a"), right=lit(1)), id="whitespace-and-newlines"),
]


@pytest.mark.parametrize(("text", "expected"), EXPRESSIONS)
def test_expression_rules(text: str, expected: Any) -> None:
    """Each expression rule builds the expected frozen nodes."""
    assert parse_expression(text) == expected


def test_spans_point_into_the_source() -> None:
    """Nodes carry 0-based offsets and 1-based line/column of where they were written."""
    expr = parse_expression("a and\n  b == 1")
    assert isinstance(expr, BoolOp)
    compare = expr.operands[1]
    assert compare.span is not None
    assert (compare.span.start, compare.span.end, compare.span.line, compare.span.column) == (8, 14, 2, 3)


def test_leaf_spans_are_offset_to_the_whole_string() -> None:
    """Positions of nodes inside a placeholder are relative to the whole leaf string."""
    leaf = compile_leaf("ab\ncd {{ x | upper }}")
    output = leaf.parts[1]
    assert isinstance(output, Output) and isinstance(output.expr, Pipe)
    span = output.expr.value.span
    assert span is not None and (span.start, span.line, span.column) == (9, 2, 7)


# -- interpolation rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        param(
            "a {{ x }} b",
            (Text(value="a "), Output(expr=path("x"), plain=True), Text(value=" b")),
            id="plain",
        ),
        param(
            "{{ x | upper }}",
            (Output(expr=Pipe(value=path("x"), filters=(Filter(name="upper"),))),),
            id="expression",
        ),
        param(
            "{{#if a}}1{{else}}2{{/if}}",
            (IfBlock(test=path("a"), then=(Text(value="1"),), otherwise=(Text(value="2"),)),),
            id="if-else",
        ),
        param(
            "{{ #if a }}1{{ /if }}",
            (IfBlock(test=path("a"), then=(Text(value="1"),)),),
            id="tags-with-spaces",
        ),
        param(
            "{{#if a}}{{#if b}}x{{/if}}{{/if}}",
            (IfBlock(test=path("a"), then=(IfBlock(test=path("b"), then=(Text(value="x"),)),)),),
            id="nested",
        ),
        param(
            "{{#if a}}{{else}}{{#if b}}y{{/if}}{{/if}}",
            (
                IfBlock(
                    test=path("a"), then=(), otherwise=(IfBlock(test=path("b"), then=(Text(value="y"),)),)
                ),
            ),
            id="nested-in-else",
        ),
    ],
)
def test_interpolation_rules(text: str, parts: tuple[Any, ...]) -> None:
    """Leaves split into text, plain paths, expressions and nested {{#if}} blocks."""
    assert compile_leaf(text).parts == parts


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        param("a", ("a", ()), id="name"),
        param("a.b[0]", ("a", ("b", "0")), id="mixed"),
        param('$item["x.y"]', ("$item", ("x.y",)), id="quoted"),
        param("a[it's]", ("a", ("it's",)), id="verbatim-with-quote"),
    ],
)
def test_split_path_token(token: str, expected: tuple[str, tuple[str, ...]]) -> None:
    """PATH tokens split into a head and segments; quoted brackets are decoded."""
    assert split_path_token(token) == expected


# -- unparser -------------------------------------------------------------------------------------------


def _depth(node: Any) -> int:
    best, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        best = max(best, depth)
        stack.extend((child, depth + 1) for child in n._children(current))
    return best


@settings(max_examples=300)
@given(expressions())
def test_parse_unparse_round_trip(expr: Any) -> None:
    """parse(unparse(node)) == node for any expression AST."""
    assume(_depth(expr) <= 8)
    text = unparse(expr)
    assert parse_expression(text) == expr, text


@pytest.mark.parametrize(("text", "expected"), EXPRESSIONS)
def test_unparse_of_parsed_expressions_is_stable(text: str, expected: Any) -> None:
    """Unparsing a parsed expression and parsing it again gives the same AST."""
    assert parse_expression(unparse(parse_expression(text))) == expected


def test_unparse_writes_canonical_text() -> None:
    """unparse adds only the parentheses precedence needs."""
    expr = parse_expression("(a or b) and not (c == 1) | upper")
    assert unparse(expr) == "(a or b) and not c == 1 | upper"


def test_iter_nodes_walks_everything() -> None:
    """iter_nodes visits every node depth first, without recursion."""
    expr = parse_expression("len(a) > 1 and [b, c | upper]")
    kinds = [type(node).__name__ for node in iter_nodes((expr,))]
    assert kinds == [
        "BoolOp",
        "Compare",
        "Call",
        "Path",
        "Literal",
        "ListExpr",
        "Path",
        "Pipe",
        "Path",
        "Filter",
    ]


def test_no_internal_names_in_any_error() -> None:
    """Syntax errors for a range of broken inputs never expose grammar-internal names."""
    for text in [
        "a ==",
        "(",
        "[1,",
        '{"a" 1}',
        "a |",
        "a | 1",
        "f(",
        "not",
        "a b",
        "'x",
        "a ! b",
        "$",
        "#if",
    ]:
        with pytest.raises(TemplateValidationError) as caught:
            parse_expression(text)
        message = caught.value.issues[0].message
        assert not re.search(r"__ANON|expr__|\$END|RULE|TERMINAL|[A-Z]{4,}", message), (text, message)
