"""Generated leaf functions: same output as the closures, and no template text in their source."""

from __future__ import annotations

import io
import keyword
import re
import tokenize
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from storyforge import compile_template, render
from storyforge.engine import assembler, codegen
from storyforge.engine.compiler import clear_cache
from storyforge.engine.errors import TemplateValidationError
from storyforge.engine.parser import compile_leaf

# Template text that would break or subvert generated code if it were ever spliced into it.
_HOSTILE = [
    '"',
    "'",
    '"""',
    "'''",
    "\\",
    "\\n",
    "\n",
    "\r",
    "{{",
    "}}",
    "{",
    "}",
    "%s",
    "%",
    "#",
    "__import__('os').system('x')",
    "'); raise SystemExit('",
    '"""; import os; """',
    "lambda: 0",
    "\\x00",
    "\x00",
    "\u2028",
    "é",
    "f'{x}'",
    "c0",
    "t0",
    "_open",
    "ctx",
    "item",
]
_HOLES = ["{{item}}", "{{item.a}}", "{{item.b}}", "{{a}}", "{{b}}", "{{ item.a }}", "{{x}}"]
_KEYS = st.sampled_from(["a", "b", "x", "c0", "_open", '"', "\\"])
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["{{a}}", "{{item}}", "  ", "\t", "\u3000", "x"]),
    st.lists(st.integers(), max_size=2),
)
_dicts = st.dictionaries(_KEYS, _VALUES, max_size=3)
_texts = st.lists(
    st.one_of(st.sampled_from(_HOSTILE), st.sampled_from(_HOLES), st.text(max_size=6)), max_size=10
).map("".join)


def closure_leaf(text: str) -> Any:
    codegen.ENABLED = False
    try:
        return assembler.simple_leaf(compile_leaf(text))
    finally:
        codegen.ENABLED = True


@settings(max_examples=400, deadline=None)
@given(_texts, st.one_of(_VALUES, _dicts), st.one_of(_dicts, _VALUES))
def test_generated_leaf_matches_closure(text: str, item: Any, ctx: Any) -> None:
    try:
        leaf = compile_leaf(text)
    except TemplateValidationError:
        assume(False)
        return
    generated = codegen.generate_leaf(leaf)
    closure = closure_leaf(text)
    assert (generated is None) == (closure is None)
    if generated is not None:
        assert generated(item, ctx) == closure(item, ctx)


_ALLOWED_NAMES = {"leaf", "item", "ctx", "cls", "text", "len", "__class__", "strip", *codegen._HELPERS}
_GENERATED_NAME = re.compile(r"[ctv][0-9]+")
_FSTRING_OF_NAMES = re.compile(r'f"(\{[ct][0-9]+\})*"')


def source_tokens(source: str) -> Iterator[tokenize.TokenInfo]:
    yield from tokenize.generate_tokens(io.StringIO(source).readline)


@settings(max_examples=300, deadline=None)
@given(_texts)
def test_no_template_text_in_generated_source(text: str) -> None:
    try:
        generated = codegen.generate_leaf(compile_leaf(text))
    except TemplateValidationError:
        assume(False)
        return
    assume(generated is not None)
    assert generated is not None
    for token in source_tokens(generated.source):
        if token.type == tokenize.NAME:
            assert (
                keyword.iskeyword(token.string)
                or token.string in _ALLOWED_NAMES
                or _GENERATED_NAME.fullmatch(token.string)
            ), token
        elif token.type == tokenize.STRING:
            assert _FSTRING_OF_NAMES.fullmatch(token.string), token
        else:
            assert token.type in (
                tokenize.OP,
                tokenize.NEWLINE,
                tokenize.NL,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
                tokenize.NUMBER,
            ), token
    # every literal piece and key is a constant, in order of appearance
    assert all(isinstance(c, str) for c in generated.constants)


@pytest.mark.parametrize(
    ("text", "served"),
    [
        ("  - {{item}}", True),
        ("[{{item.turnNo}}] {{item.authorName}}: {{item.content}}", True),
        ("{{a}} and {{item.b}}", True),
        ("no placeholders", False),
        ("{{item.a.b}}", False),
        ("{{ a | upper }}", False),
        ("{{ctx}}", False),
    ],
)
def test_shapes_served(text: str, served: bool) -> None:
    assert (codegen.generate_leaf(compile_leaf(text)) is not None) is served


def test_source_is_inspectable() -> None:
    generated = codegen.generate_leaf(compile_leaf('say """{{item.line}}""" \\ now'))
    assert generated is not None
    assert generated.source.startswith("def leaf(item, ctx):\n")
    assert generated.constants == ('say """', "line", '""" \\ now')
    assert 'f"{c0}{t0}{c2}"' in generated.source
    assert generated({"line": "hi"}, {}) == ('say """hi""" \\ now', True)


def _template(content: str, item_content: str) -> dict[str, Any]:
    return {
        "id": "t",
        "name": "t",
        "task": "tinystories",
        "version": 1,
        "layout": [
            {"kind": "message", "role": "system", "content": content},
            {"kind": "slot", "name": "s"},
        ],
        "slots": {
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "required"},
                        "map": [{"kind": "message", "role": "user", "content": item_content}],
                    }
                ],
            }
        },
    }


def _render(template: dict[str, Any], ctx: dict[str, Any], budget: int | None, generate: bool) -> Any:
    from storyforge.tasks.base import get_task_kind

    kind = get_task_kind("tinystories")
    codegen.ENABLED = generate
    try:
        clear_cache()
        compiled = compile_template(template, task=kind.name, allowed_sources=kind.allowed_sources)
    finally:
        codegen.ENABLED = True
        clear_cache()
    result = render(compiled, ctx, kind.registry(ctx), budget=budget)
    return result.messages, result.warnings, [(e.kind, e.status, e.reason) for e in result.trace.events]


@settings(max_examples=150, deadline=None)
@given(
    _texts,
    _texts,
    st.dictionaries(st.sampled_from(["protagonist", "theme", "a", "b"]), _VALUES, max_size=4),
    st.lists(st.one_of(st.text(max_size=8), st.sampled_from(["{{a}}", '"""', "\\"])), max_size=4),
    st.one_of(st.none(), st.integers(min_value=0, max_value=40)),
)
def test_render_same_with_and_without_generated_code(
    content: str, item_content: str, ctx: dict[str, Any], required: list[str], budget: int | None
) -> None:
    template = _template(content, item_content)
    full = {**ctx, "required": required, "banned": []}
    try:
        expected = _render(template, full, budget, generate=False)
    except TemplateValidationError:
        assume(False)
        return
    assert _render(template, full, budget, generate=True) == expected


def test_compiled_template_shows_generated_source() -> None:
    template = _template("Hello {{a}}", "  - {{item}}")
    compiled = compile_template(template, task="tinystories")
    shown = compiled.generated_source()
    assert shown.count("def leaf(item, ctx):") == 2
    assert "# layout[0]: c0='Hello ', c1='a'" in shown
    assert "# slots.s.plan[0].map[0]: c0='  - '" in shown


@pytest.mark.parametrize(("holes", "generated"), [(codegen.MAX_HOLES, True), (codegen.MAX_HOLES + 1, False)])
def test_a_leaf_with_very_many_placeholders_is_served_by_the_closures(holes: int, generated: bool) -> None:
    """Past codegen.MAX_HOLES placeholders (a pasted text full of them), a leaf gets no
    generated function, which Python would compile in superlinear time; it renders the same."""
    text = "".join("w {{x}} " if i % 2 else "{{item.a}}|" for i in range(holes))
    leaf = compile_leaf(text)
    assert (codegen.generate_leaf(leaf) is not None) is generated
    assert (codegen.leaf_pieces(leaf) is not None) is generated
    template = {
        "id": "many",
        "name": "many",
        "task": "x",
        "version": 1,
        "layout": [{"kind": "message", "role": "user", "content": text}],
        "slots": {},
    }
    expected = "".join("w 1 " if i % 2 else "|" for i in range(holes))
    clear_cache()
    assert render(compile_template(template), {"x": 1}).messages == [{"role": "user", "content": expected}]
