"""Leaf strings: reference placeholders (§5), the extension language, errors and limits."""

from __future__ import annotations

import dataclasses
import pickle
import re
import threading
from textwrap import dedent
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import param
from strategies import contexts, leaf_texts, scopes

from storyforge.engine.nodes import Leaf, Output, Path, Text
from storyforge.engine.parser import compile_leaf, is_expression
from storyforge.engine.runtime import (
    MAX_RENDER_CHARS,
    Scope,
    is_contentful,
    lookup_scope,
    parse_path,
    to_text,
)
from storyforge.errors import RenderLimitError, TemplatePath, TemplateValidationError


def render(text: str, ctx: Any = None, item: Any = None) -> str:
    return compile_leaf(text).render(Scope({} if ctx is None else ctx, item))[0]


_circular: dict[str, Any] = {"name": "loop"}
_circular["self"] = _circular

_CHAIN = {f"hop{i}": f"{{{{hop{i + 1}}}}}" for i in range(1, 21)}


# -- §12 Leaf: every pinned reference case ------------------------------------------------------------

LEAF_CASES = [
    param("Static text", {}, None, "Static text", id="static"),
    param("", {}, None, "", id="empty-string"),
    param("{{a}} and {{b}}", {"a": "x", "b": "y"}, None, "x and y", id="several"),
    param("{{a}}{{b}}", {"a": "x", "b": "y"}, None, "xy", id="adjacent"),
    param("{{a}}-{{a}}", {"a": "x"}, None, "x-x", id="repeated"),
    param("{{  a  }}", {"a": "x"}, None, "x", id="surrounding-whitespace"),
    param("{{\n a \t}}", {"a": "x"}, None, "x", id="newline-whitespace"),
    param("[{{zero}}]", {"zero": 0}, None, "[0]", id="zero"),
    param("[{{f}}]", {"f": False}, None, "[false]", id="false"),
    param("[{{e}}]", {"e": ""}, None, "[]", id="empty-value"),
    param("[{{missing}}]", {}, None, "[]", id="missing"),
    param("[{{a.b.c}}]", {"a": {"b": {}}}, None, "[]", id="partly-missing"),
    param("[{{a.b}}]", {"a": None}, None, "[]", id="through-null"),
    param("{{n}} {{t}} {{f}}", {"n": 2.5, "t": True, "f": 2.0}, None, "2.5 true 2", id="numbers-booleans"),
    param(
        "{{o}}",
        {"o": {"crates": 3.0, "tags": ["a", "é"]}},
        None,
        '{"crates":3,"tags":["a","é"]}',
        id="object-json",
    ),
    param("{{l}}", {"l": [1, None, "x"]}, None, '[1,null,"x"]', id="list-json"),
    param("[{{c}}]", {"c": _circular}, None, "[]", id="circular"),
    param("{{arr.length}}", {"arr": [1, 2, 3]}, None, "3", id="array-length"),
    param("[{{vessel.length}}]", {"vessel": "Kite"}, None, "[]", id="string-has-no-length"),
    param("[{{vessel.toString}}]", {"vessel": "Kite"}, None, "[]", id="nothing-inherited"),
    param("{{list[0]}}", {"list": ["a", "b"]}, None, "a", id="bracket-index"),
    param("{{grid[0].[1]}}", {"grid": [["a", "b"]]}, None, "b", id="nested-brackets"),
    param("{{dims[beam.m]}}", {"dims": {"beam.m": 4}}, None, "4", id="bracket-key-with-dot"),
    param("{{[0].name}}", {"0": {"name": "lead"}}, None, "lead", id="leading-bracket"),
    param("{{m.1}}", {"m": {"1": "one"}}, None, "one", id="numeric-string-key"),
    param("[{{list[5]}}]", {"list": ["a"]}, None, "[]", id="out-of-range"),
    param("[{{list[0}}]", {"list": ["a"]}, None, "[]", id="unclosed-bracket"),
    param("{{x.[]}}", {"x": {"": "empty key"}}, None, "empty key", id="empty-bracket"),
    param("{{unclosed and {{x}}", {"x": "X"}, None, "{{unclosed and X", id="unclosed-placeholder"),
    param("{{{x}}}", {"x": "X"}, None, "{X}", id="triple-braces"),
    param("{ x }", {"x": "X"}, None, "{ x }", id="single-braces"),
    param("{{}}", {}, None, "{{}}", id="no-inner-text-is-literal"),
    param("[{{ }}]", {"a": 1}, None, "[]", id="empty-path-renders-empty"),
    param("{{item}}", {"item": "ctx item"}, "loop item", "loop item", id="item-wins"),
    param("{{ctx.item}}", {"item": "ctx item"}, "loop item", "ctx item", id="ctx-item"),
    param("[{{index}}] [{{parent}}]", {}, "x", "[] []", id="index-and-parent-render-empty"),
    param("{{title}}", {"globals": {"title": "G"}}, None, "G", id="globals-fallback"),
    param("[{{title}}]", {"title": None, "globals": {"title": "G"}}, None, "[]", id="null-blocks-fallback"),
    param("{{my key}}", {"my key": "spaced"}, None, "spaced", id="key-with-space"),
    param("{{first-name}}", {"first-name": "Ann"}, None, "Ann", id="hyphenated-key"),
    # recursive expansion
    param("{{a}}", {"a": "x {{b}} y", "b": "B"}, None, "x B y", id="expansion-mixed"),
    param("{{a[0]}}", {"a": ["<{{b.c}}>"], "b": {"c": "C"}}, None, "<C>", id="expansion-through-brackets"),
    param("{{a}}", {"a": "{{b}}", "b": "{{c}}", "c": "C"}, None, "C", id="expansion-chain-a-b-c"),
    param("{{a}}", {"a": "x {{a}} y"}, None, "x x x x x x {{a}} y y y y y y", id="self-reference"),
    param("{{a}}", {"a": "{{b}}", "b": "{{a}}"}, None, "{{a}}", id="mutual-recursion"),
    param("{{hop1}}", _CHAIN, None, "{{hop7}}", id="twenty-link-chain-stops-at-7"),
    param("{{a}}", {"a": "{{ broken {{b}"}, None, "{{ broken {{b}", id="malformed-inner-braces"),
    param("{{a}}", {"a": ["{{b}}"], "b": "B"}, None, '["{{b}}"]', id="no-expansion-inside-lists"),
    param("{{a}}", {"a": "{{#if b}}unclosed"}, {}, "unclosed", id="block-tag-in-data-is-a-path"),
    param("[{{a}}]", {"a": "{{ b | upper }}", "b": "x"}, None, "[]", id="filter-in-data-is-a-path"),
    param("{{item.t}}", {}, {"t": "<{{item.u}}>", "u": 1}, "<1>", id="expansion-keeps-item"),
]


@pytest.mark.parametrize(("text", "ctx", "item", "expected"), LEAF_CASES)
def test_leaf_reference_cases(text: str, ctx: dict[str, Any], item: Any, expected: str) -> None:
    """Every leaf edge case pinned by the reference renders identically."""
    assert render(text, ctx, item) == expected


def test_non_mapping_scope_renders_empty() -> None:
    """A context that is not a mapping resolves nothing (but static text stays)."""
    leaf = compile_leaf("[{{a}}][{{length}}]")
    assert leaf.render(Scope("a string"))[0] == "[][]"
    assert leaf.render(Scope(None))[0] == "[][]"


def test_expansion_leaves_scope_unmodified() -> None:
    """Rendering (with expansion) never changes the context it reads."""
    ctx = {"a": "x {{b}}", "b": ["q"], "globals": {"g": 1}}
    before = repr(ctx)
    render("{{a}} {{b}} {{g}}", ctx)
    assert repr(ctx) == before


@pytest.mark.parametrize(
    ("text", "ctx", "contentful"),
    [
        param("static", {}, False, id="static-is-not-content"),
        param("Hi {{a}}", {"a": ""}, False, id="empty-value"),
        param("Hi {{a}}", {"a": " \n\t"}, False, id="whitespace-value"),
        param("Hi {{a}}", {"a": "\ufeff"}, False, id="bom-is-whitespace"),
        param("Hi {{a}}", {"a": "\x85"}, True, id="nel-is-content"),
        param("{{a}}{{b}}", {"a": "", "b": "x"}, True, id="one-of-two"),
        param("{{a}}", {"a": 0}, True, id="zero-is-content"),
        param("{{a}}", {"a": "{{b}}", "b": "  "}, False, id="after-expansion"),
        param("{{ a | default('') }}", {}, False, id="filter-result-empty"),
        param("{{#if a}}text{{/if}}", {"a": True}, True, id="taken-branch-text-counts"),
        param("{{#if a}}text{{/if}}", {"a": False}, False, id="untaken-branch"),
        param("{{#if a}}  {{/if}}", {"a": True}, False, id="whitespace-branch"),
    ],
)
def test_contentful_flag(text: str, ctx: dict[str, Any], contentful: bool) -> None:
    """The flag says whether any placeholder produced non-whitespace text (JS trim)."""
    assert compile_leaf(text).render(Scope(ctx))[1] is contentful


@pytest.mark.parametrize(
    ("text", "has_variables"),
    [
        param("plain", False, id="plain"),
        param("{{ }}", True, id="empty-placeholder"),
        param("{x}", False, id="single-braces"),
        param("a {{b}}", True, id="placeholder"),
        param("{{#if a}}x{{/if}}", True, id="block"),
    ],
)
def test_has_variables(text: str, has_variables: bool) -> None:
    """has_variables is true when the text contains at least one placeholder."""
    assert compile_leaf(text).has_variables is has_variables


# -- which placeholders are extension expressions -----------------------------------------------------


@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        param("character.name", False, id="dotted-path"),
        param(" item ", False, id="item"),
        param("dims[beam.m]", False, id="bracket"),
        param("my key", False, id="spaced-key"),
        param("first-name", False, id="hyphenated"),
        param("a[x | y]", False, id="pipe-inside-brackets"),
        param("or", False, id="single-keyword-word"),
        param("x | upper", True, id="pipe"),
        param("len(x)", True, id="call"),
        param("$index", True, id="reserved"),
        param("a == b", True, id="comparison"),
        param("$index + 1", True, id="plus"),
        param("count - 1", True, id="spaced-minus"),
        param("a and b", True, id="and"),
        param("not done", True, id="not"),
        param("x in xs", True, id="in"),
        param("'quoted'", True, id="string-literal"),
    ],
)
def test_is_expression(inner: str, expected: bool) -> None:
    """The documented rule decides when a placeholder is an extension expression."""
    assert is_expression(inner) is expected


# -- extension language -----------------------------------------------------------------------------

_DATA = {
    "name": "bob",
    "required": ["a red ball", "a kite"],
    "contexts": ["a", "b"],
    "banned": [],
    "n": 3,
    "title": "  Spaced  ",
    "model": "llama3",
    "story": {"chapters": [{"t": "One"}, {"t": "Two"}]},
    "ctx": None,
}

EXTENSION_CASES = [
    param('{{ x | default("n/a") }}', {}, "n/a", id="default"),
    param('{{ required | join(", ") }}', _DATA, "a red ball, a kite", id="join"),
    param("{{ name | upper }}/{{ name | lower }}", {"name": "Bob"}, "BOB/bob", id="upper-lower"),
    param("[{{ title | trim }}]", _DATA, "[Spaced]", id="trim"),
    param("{{ required | length }}", _DATA, "2", id="length-filter"),
    param('{{ required | bullets("  - ") }}', _DATA, "  - a red ball\n  - a kite", id="bullets"),
    param("{{ contexts | numbered }}", _DATA, "[1] a\n[2] b", id="numbered"),
    param('{{ contexts | numbered("#. ") }}', _DATA, "1. a\n2. b", id="numbered-format"),
    param("{{ required | first }}|{{ required | last }}", _DATA, "a red ball|a kite", id="first-last"),
    param('{{ name | upper | replace("B", "R") }}', _DATA, "ROR", id="filter-chain"),
    param('{{ "x" + name }}', _DATA, "xbob", id="string-concat"),
    param("{{ n + 1 }} {{ n - 1 }} {{ (-n) }} [{{ -n }}]", _DATA, "4 2 -3 []", id="arithmetic"),
    param("{{ len(required) }}", _DATA, "2", id="len"),
    param("{{ name == 'bob' }}", _DATA, "true", id="comparison-renders-bool"),
    param("{{ missing or 'fallback' }}", _DATA, "fallback", id="or-returns-value"),
    param("{{ story.chapters[1].t }}", _DATA, "Two", id="path-in-expression"),
    param('{{ story["chapters"][0]["t"] | upper }}', _DATA, "ONE", id="quoted-brackets"),
    param("{{ [1, 2] | join('+') }}", {}, "1+2", id="list-literal"),
    param("{{#if required}}yes{{else}}no{{/if}}", _DATA, "yes", id="if-true"),
    param("{{#if banned}}yes{{else}}no{{/if}}", _DATA, "no", id="if-false"),
    param("{{#if banned}}yes{{/if}}", _DATA, "", id="if-without-else"),
    param(
        "{{#if n > 2}}big{{#if model == 'llama3'}} llama{{else}} other{{/if}}{{else}}small{{/if}}",
        _DATA,
        "big llama",
        id="nested-if",
    ),
    param(
        '{{#if banned}}{{ banned | bullets("  - ") }}{{else}}  NONE{{/if}}',
        _DATA,
        "  NONE",
        id="tinystories-banned",
    ),
    param("{{#if not banned}}empty{{/if}}", _DATA, "empty", id="if-not"),
    param("{{#if 'a' in required}}x{{else}}y{{/if}}", _DATA, "y", id="in-list"),
    param("{{#if 'red' in required[0]}}x{{/if}}", _DATA, "x", id="in-string"),
    param("{{ $ctx.name }}", _DATA, "bob", id="reserved-ctx"),
    param("{{ $globals.g }}", {"globals": {"g": "G"}}, "G", id="reserved-globals"),
    param("[{{ $index }}]", _DATA, "[]", id="index-outside-loop"),
    param("[{{ $index + 1 }}]", _DATA, "[]", id="index-plus-one-outside-loop"),
]


@pytest.mark.parametrize(("text", "ctx", "expected"), EXTENSION_CASES)
def test_extension_language(text: str, ctx: dict[str, Any], expected: str) -> None:
    """Filters, blocks, literals, operators and reserved names render as documented."""
    assert render(text, ctx) == expected


def test_reserved_names_inside_loops() -> None:
    """$index, $item and $parent read the loop frames, so $index + 1 numbers from 1."""
    outer = Scope({"k": 1}).push({"title": "Chapter"}, 0)
    inner = outer.push({"text": "line"}, 2)
    leaf = compile_leaf("{{ $index + 1 }}. {{ $item.text }} ({{ $parent.title }}) [{{index}}]")
    assert leaf.render(inner)[0] == "3. line (Chapter) []"


def test_filter_arguments_can_be_paths() -> None:
    """A filter argument may be a path resolved at render time."""
    assert render("{{ contexts | join(sep) }}", {"contexts": ["a", "b"], "sep": "\n\n"}) == "a\n\nb"


def test_compiled_leaves_are_cached_and_shared() -> None:
    """compile_leaf returns the same compiled object for the same text."""
    assert compile_leaf("Hi {{name}}") is compile_leaf("Hi {{name}}")


def test_leaf_ast_shapes() -> None:
    """A plain placeholder compiles to Text/Output(Path) parts; spans are left out of equality."""
    leaf = compile_leaf("Hi {{ a.b[0] }}!")
    assert leaf.parts == (
        Text(value="Hi "),
        Output(expr=Path(segments=("a", "b", "0")), plain=True),
        Text(value="!"),
    )
    span = leaf.parts[1].span
    assert span is not None and (span.start, span.end, span.line, span.column) == (3, 15, 1, 4)
    assert leaf.paths() == (("a", "b", "0"),)


def test_leaves_are_frozen_hashable_and_picklable_issues() -> None:
    """Leaves are immutable and hashable; equal text gives equal leaves."""
    leaf = compile_leaf("{{ x | upper }}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        leaf.source = "other"  # type: ignore[misc]
    assert hash(leaf) == hash(dataclasses.replace(leaf))
    assert leaf == dataclasses.replace(leaf)


def test_render_is_thread_safe() -> None:
    """One leaf rendered from many threads gives each thread its own correct result."""
    leaf = compile_leaf("{{#if item}}{{ item | upper }}{{else}}none{{/if}} {{ $index }}")
    results: dict[int, tuple[str, bool]] = {}

    def work(i: int) -> None:
        scope = Scope({}).push(f"v{i}", i)
        for _ in range(200):
            results[i] = leaf.render(Scope({}, f"v{i}", scope.frames))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: (f"V{i} {i}", True) for i in range(8)}


# -- syntax errors: whole messages --------------------------------------------------------------------

ERROR_CASES = [
    param(
        "{{#if turn.speaker and }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 24: expected an expression after 'and', got '}}'
              | {{#if turn.speaker and }}
              |                        ^""",
        id="missing-operand",
    ),
    param(
        "Hello {{#if x}}open",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 20: unexpected end of template; storyforge was looking for '{{else}}' or '{{/if}}'. The innermost block that needs to be closed is '{{#if x}}' (line 1, column 7).
              | Hello {{#if x}}open
              |                    ^""",
        id="unclosed-if",
    ),
    param(
        "{{#if a}}{{#if b}}x{{/if}}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 27: unexpected end of template; storyforge was looking for '{{else}}' or '{{/if}}'. The innermost block that needs to be closed is '{{#if a}}' (line 1, column 1).
              | {{#if a}}{{#if b}}x{{/if}}
              |                           ^""",
        id="unclosed-outer-if",
    ),
    param(
        "x{{/if}}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 2: unexpected '{{/if}}': there is no open '{{#if …}}' block to close.
              | x{{/if}}
              |  ^""",
        id="stray-end",
    ),
    param(
        "{{else}}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 1: unexpected '{{else}}' outside an '{{#if …}}' block.
              | {{else}}
              | ^""",
        id="stray-else",
    ),
    param(
        "{{#if a}}1{{else}}2{{else}}3{{/if}}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 20: unexpected second '{{else}}'; expected '{{/if}}'. The innermost block that needs to be closed is '{{#if a}}' (line 1, column 1).
              | {{#if a}}1{{else}}2{{else}}3{{/if}}
              |                    ^""",
        id="second-else",
    ),
    param(
        "{{#if a}}{{/endif}}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 10: unknown block tag '{{/endif}}'; storyforge knows '{{#if …}}', '{{else}}' and '{{/if}}'. The innermost block that needs to be closed is '{{#if a}}' (line 1, column 1).
              | {{#if a}}{{/endif}}
              |          ^""",
        id="jinja-style-end-tag",
    ),
    param(
        "{{ name | uper }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 11: unknown filter 'uper'. Did you mean 'upper'? Available: bullets, default, first, indent, join, json, last, length, lower, numbered, replace, trim, upper
              | {{ name | uper }}
              |           ^""",
        id="unknown-filter",
    ),
    param(
        "{{ x | join(1, 2) }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 8: filter 'join' takes 0 to 1 argument, got 2; use join(", ")
              | {{ x | join(1, 2) }}
              |        ^""",
        id="filter-arity",
    ),
    param(
        "Line one\n  {{ (a + }}",
        """\
        1 problem
          slots.history.plan[2].content, line 2, column 11: expected an expression after '+', got '}}'
              |   {{ (a + }}
              |           ^""",
        id="multiline-position",
    ),
    param(
        "{{ a == == b }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 9: expected an expression after '==', got '=='
              | {{ a == == b }}
              |         ^""",
        id="doubled-operator",
    ),
    param(
        "{{ len(x) @ 2 }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 11: expected an operator, '|' or '}}' after ')', got '@'
              | {{ len(x) @ 2 }}
              |           ^""",
        id="unexpected-character",
    ),
    param(
        "{{ $loop.index }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 4: unknown reserved name '$loop'; expected one of '$ctx', '$globals', '$index', '$item', '$parent'
              | {{ $loop.index }}
              |    ^""",
        id="unknown-reserved-name",
    ),
    param(
        "{{ lenght(x) }}",
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 4: unknown function 'lenght()'. Did you mean 'len'? Available: exists, len, nonEmpty, source
              | {{ lenght(x) }}
              |    ^""",
        id="unknown-function",
    ),
    param(
        '{{ source("turns") }}',
        """\
        1 problem
          slots.history.plan[2].content, line 1, column 4: source() reads task data and can only be used in conditions; in a leaf use a path such as {{ item.text }} or $item
              | {{ source("turns") }}
              |    ^""",
        id="source-in-leaf",
    ),
]


@pytest.mark.parametrize(("text", "expected"), ERROR_CASES)
def test_syntax_error_messages(text: str, expected: str) -> None:
    """Syntax errors name the place, what was expected and what was found, with a caret."""
    path = TemplatePath(("slots", "history", "plan", 2, "content"))
    with pytest.raises(TemplateValidationError) as caught:
        compile_leaf(text, path)
    assert str(caught.value) == dedent(expected)
    assert all(issue.code == "syntax" and issue.path == path for issue in caught.value.issues)


def test_syntax_errors_never_mention_internal_token_names() -> None:
    """No message exposes Lark's internal names (__ANON_3, expr__PATH, $END)."""
    texts = ["{{ a ==  }}", "{{ (a }}", "{{ a | }}", "{{#if}}", "{{ [1, }}", "{{ f(1 2) }}", "{{ 'x' 'y' }}"]
    for text in texts:
        with pytest.raises(TemplateValidationError) as caught:
            compile_leaf(text)
        for issue in caught.value.issues:
            assert not re.search(r"__ANON|expr__|\$END|[A-Z]{4,}", issue.message), issue.message


def test_non_string_leaf_is_a_validation_error() -> None:
    """compile_leaf of a non-string raises TemplateValidationError, not TypeError."""
    with pytest.raises(TemplateValidationError, match="expected a string, got int"):
        compile_leaf(3)  # type: ignore[arg-type]


def test_validation_error_survives_pickling() -> None:
    """A syntax error pickles with its issues intact."""
    with pytest.raises(TemplateValidationError) as caught:
        compile_leaf("{{#if x}}")
    clone = pickle.loads(pickle.dumps(caught.value))
    assert clone.issues == caught.value.issues and str(clone) == str(caught.value)


# -- limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        param("{{ " + "[" * 200 + "]" * 200 + " | length }}", id="nested-lists"),
        param("{{ " + "not " * 10_000 + "x }}", id="not-chain"),
        param("{{ " + "(" * 10_000 + " }}", id="ten-thousand-open-parens"),
        param("{{#if x}}" * 40 + "{{/if}}" * 40, id="nested-blocks"),
    ],
)
def test_deep_nesting_is_a_validation_error(text: str) -> None:
    """Deeply nested expressions or blocks raise TemplateValidationError, never RecursionError."""
    with pytest.raises(TemplateValidationError):
        compile_leaf(text)


def test_many_parentheses_around_one_value_are_fine() -> None:
    """Redundant parentheses do not nest the AST, so they compile and render."""
    assert render("{{ " + "(" * 10_000 + "x" + ")" * 10_000 + " | upper }}", {"x": "ok"}) == "OK"


def test_output_size_is_bounded() -> None:
    """A leaf whose output would pass MAX_RENDER_CHARS raises RenderLimitError naming the limit."""
    bomb = "{{a}}" * 100
    with pytest.raises(RenderLimitError, match="MAX_RENDER_CHARS=1,000,000"):
        render("{{a}}", {"a": bomb})
    with pytest.raises(RenderLimitError, match="MAX_RENDER_CHARS"):
        render("{{a}}{{a}}", {"a": "x" * (MAX_RENDER_CHARS // 2 + 1)})
    with pytest.raises(RenderLimitError, match="MAX_RENDER_CHARS"):
        render("{{#if a}}{{a}}{{a}}{{/if}}", {"a": "x" * (MAX_RENDER_CHARS // 2 + 1)})


def test_output_at_the_limit_renders() -> None:
    """Exactly MAX_RENDER_CHARS characters is still allowed."""
    assert len(render("{{a}}", {"a": "x" * MAX_RENDER_CHARS})) == MAX_RENDER_CHARS


# -- properties ----------------------------------------------------------------------------------------


@settings(max_examples=400)
@given(leaf_texts())
def test_any_string_compiles_or_raises_validation_error(text: str) -> None:
    """Every string either compiles or raises TemplateValidationError with located issues."""
    try:
        leaf = compile_leaf(text)
    except TemplateValidationError as error:
        assert error.issues
        for issue in error.issues:
            assert issue.code == "syntax" and issue.line is not None and issue.column is not None
    else:
        assert isinstance(leaf, Leaf) and leaf.source == text


@settings(max_examples=120)
@given(leaf_texts(), scopes())
def test_render_is_deterministic(text: str, scope: Scope) -> None:
    """Rendering the same leaf against the same scope gives the same text and flag."""
    try:
        leaf = compile_leaf(text)
    except TemplateValidationError:
        return
    first = leaf.render(scope)
    assert leaf.render(scope) == first
    assert isinstance(first[0], str) and isinstance(first[1], bool)


def _reference_render(text: str, ctx: dict[str, Any], depth: int = 0) -> tuple[str, bool]:
    """The §5 algorithm written as directly as possible (plain reference paths only)."""
    contentful = False

    def replace(match: re.Match[str]) -> str:
        nonlocal contentful
        path = match.group(1).strip()
        value = lookup_scope(Scope(ctx), parse_path(path)) if path else None
        if isinstance(value, str) and "{{" in value:
            value = value if depth + 1 > 5 else _reference_render(value, ctx, depth + 1)[0]
        out = to_text(value)
        contentful = contentful or is_contentful(out)
        return out

    return re.sub(r"\{\{([^{}]+)}}", replace, text), contentful


_plain_fragments = st.sampled_from(
    [
        "{{",
        "}}",
        "{",
        "}",
        " ",
        "a",
        "b",
        "name",
        ".",
        "[0]",
        "[",
        "]",
        "items",
        "length",
        "globals",
        "ctx",
        "x y",
    ]
)


@settings(max_examples=150)
@given(st.lists(_plain_fragments, max_size=12).map("".join), contexts())
def test_plain_paths_match_the_reference_algorithm(text: str, ctx: dict[str, Any]) -> None:
    """Leaves of plain reference paths render exactly as the straightforward §5 algorithm."""
    assume_plain = all(not is_expression(m.group(1)) for m in re.finditer(r"\{\{([^{}]+)}}", text))
    if not assume_plain or any(m.group(1).strip()[:1] in "#/" for m in re.finditer(r"\{\{([^{}]+)}}", text)):
        return
    if any(m.group(1).strip().startswith("else") for m in re.finditer(r"\{\{([^{}]+)}}", text)):
        return
    assert compile_leaf(text).render(Scope(ctx)) == _reference_render(text, ctx)
