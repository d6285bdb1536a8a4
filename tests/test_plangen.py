"""The whole-template generated program: the same render as the closures, and no template
text in its source."""

from __future__ import annotations

import io
import keyword
import pickle
import re
import tokenize
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pytest import param
from template_strategies import BUDGETS, CONTEXTS, NO_BUDGETS, REGISTRY, compile_as, templates

from storyforge import SourceRegistry, render
from storyforge.engine import plangen
from storyforge.engine.errors import RenderLimitError

_compile = compile_as


def _outcome(compiled: Any, ctx: Any, registry: Any = REGISTRY, budget: int | None = None) -> Any:
    result = render(compiled, ctx, registry, budget=budget)
    trace = result.trace
    return result.messages, result.warnings, trace.to_dict(), trace.format()


def _both(
    template: dict[str, Any], ctx: Any, registry: Any = REGISTRY, budget: int | None = None
) -> tuple[Any, Any]:
    closures, generated = _compile(template, False), _compile(template, True)
    assert closures.program.generated is None
    assert generated.program.generated.get(True) is not None
    return _outcome(closures, ctx, registry, budget), _outcome(generated, ctx, registry, budget)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=templates(budgets=NO_BUDGETS), ctx=CONTEXTS)
@example(  # an empty slot still shown: its insert event comes before its footer's
    template={
        "id": "p",
        "name": "P",
        "task": "prop",
        "version": 1,
        "layout": [
            {
                "kind": "slot",
                "name": "a",
                "footer": [{"role": "user", "content": "static text"}],
                "omitIfEmpty": False,
            }
        ],
        "slots": {"a": {"priority": 0, "plan": []}},
    },
    ctx={},
)
def test_generated_program_renders_as_the_closures(template: dict[str, Any], ctx: dict[str, Any]) -> None:
    """Messages, warnings and the whole trace (every event, its reason, tokens and loop
    position) are the same, for random templates over every plan and layout feature."""
    expected, got = _both(template, ctx)
    assert got == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=templates(budgets=BUDGETS), ctx=CONTEXTS, budget=st.integers(0, 120))
def test_generated_budgeted_program_renders_as_the_closures(
    template: dict[str, Any], ctx: dict[str, Any], budget: int
) -> None:
    """With a global budget, slot and node budgets: the same messages, warnings (dropped
    layout blocks included) and trace (every cost, every skip and its reason)."""
    expected, got = _both(template, ctx, budget=budget)
    assert got == expected


def _template(layout: list[Any], slots: dict[str, Any]) -> dict[str, Any]:
    return {"id": "g", "name": "G", "task": "t", "version": 1, "layout": layout, "slots": slots}


def _slot(*plan: Any, **extra: Any) -> dict[str, Any]:
    return {"priority": extra.pop("priority", 0), "plan": list(plan), **extra}


def _msg(content: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"kind": "message", "role": role, "content": content, **extra}


def _loop(source: str, *body: Any, **extra: Any) -> dict[str, Any]:
    return {"kind": "forEach", "source": {"source": source}, "map": list(body), **extra}


_GROUPS = {
    "groups": [
        {"name": "a", "lines": ["a1", "a2"]},
        {"name": "b", "lines": []},
        {"name": "c", "lines": ["c1"]},
    ],
    "xs": ["x", "{{secret}}", "", 7, None, 2.5, ["l"]],
    "secret": "hidden",
    "title": "T",
}
_SOURCES = SourceRegistry(
    {
        "groups": lambda ctx, args: ctx["groups"],
        "xs": lambda ctx, args: ctx["xs"],
        "lines": lambda ctx, args: None,
        "json": lambda ctx, args: {"k": [1, float("inf")], "s": "v"},
        "boom": lambda ctx, args: 1 / 0,
    }
)

CASES = {
    # prepend with groups of unequal size (one empty): groups reverse, messages within keep order
    "prepend groups": _template(
        [{"kind": "slot", "name": "s"}],
        {
            "s": _slot(
                _loop(
                    "groups",
                    _msg("{{item.name}}"),
                    {
                        "kind": "forEach",
                        "source": {"source": "$item", "args": {"path": "lines"}},
                        "map": [_msg("- {{item}}")],
                    },
                    fillDir="prepend",
                )
            )
        },
    ),
    # values the inline fill must leave to the general rules: data that looks like a template,
    # empty strings, ints, None, floats, lists
    "fallback values": _template(
        [{"kind": "slot", "name": "s", "header": {"role": "system", "content": "{{title}}:"}}],
        {
            "s": _slot(
                _loop(
                    "xs",
                    _msg("[{{item}}]", skipIfEmptyInterpolation=True),
                    interleave={"kind": "separator", "text": "~"},
                )
            )
        },
    ),
    "from json, a failing source, order and limit": _template(
        [{"kind": "slot", "name": "s", "omitIfEmpty": False, "footer": [{"role": "user", "content": "end"}]}],
        {
            "s": _slot(
                {"kind": "message", "role": "system", "from": {"source": "json"}},
                {"kind": "message", "role": "system", "from": {"source": "boom"}},
                _loop("boom", _msg("never")),
                _loop("xs", _msg("{{item}}"), order="desc", limit=3),
                _loop("title", _msg("not a list")),
            ),
            "empty": _slot(
                _msg("only when", role="assistant", prefix=True),
                when={"type": "exists", "ref": {"source": "lines"}},
            ),
        },
    ),
    "one role, squashed at generation": _template(
        [_msg("head {{title}}"), {"kind": "slot", "name": "s"}, _msg("tail")],
        {
            "s": _slot(
                _loop("xs", _msg("{{item}}")),
                {
                    "kind": "if",
                    "when": {"type": "nonEmpty", "ref": {"source": "xs"}},
                    "then": [_msg("some")],
                    "else": [_msg("none")],
                },
            )
        },
    ),
    # separators after one templated message per item, with no global budget: fixed and
    # templated, values the inline fill leaves to the general rules, prepended, under a
    # slot budget that runs out part of the way
    "separators in the one-message loop": _template(
        [{"kind": "slot", "name": "s"}, {"kind": "slot", "name": "t"}],
        {
            "s": _slot(
                _loop("xs", _msg("<{{item}}>"), interleave={"kind": "separator", "text": "~{{item}}~"}),
                _loop(
                    "xs",
                    _msg("{{item}}", role="system", skipIfEmptyInterpolation=True),
                    interleave={"kind": "separator", "text": "--"},
                    fillDir="prepend",
                ),
            ),
            "t": _slot(
                _loop("groups", _msg("{{item.name}}"), interleave={"kind": "separator", "text": "=="}),
                _loop("xs", _msg("[{{item}}]"), interleave={"kind": "separator", "text": "{{item}}"}),
                budget={"maxTokens": 6},
            ),
        },
    ),
    # a loop whose items' scopes are built only where a value needs them: an expression
    # condition (a closure), $index, $parent and $item refs, a nested loop, a templated
    # separator, leaves the inline fill leaves to the general rules
    "item scopes built where needed": _template(
        [{"kind": "slot", "name": "s"}],
        {
            "s": _slot(
                _loop(
                    "groups",
                    {
                        "kind": "if",
                        "when": "item.name == 'a' or len(item.lines) > 0",
                        "then": [_msg("[{{item.name}}]")],
                    },
                    {"kind": "message", "role": "system", "from": {"source": "$index"}},
                    {
                        "kind": "if",
                        "when": {
                            "type": "eq",
                            "ref": {"source": "$item", "args": {"path": "lines.length"}},
                            "value": 2,
                        },
                        "then": [_msg("two lines")],
                    },
                    {
                        "kind": "forEach",
                        "source": {"source": "$item", "args": {"path": "lines"}},
                        "map": [
                            _msg("{{item}} of {{ctx.title}}"),
                            {
                                "kind": "message",
                                "role": "user",
                                "from": {"source": "$parent", "args": {"path": "name"}},
                            },
                        ],
                    },
                    interleave={"kind": "separator", "text": "~{{item.name}}~"},
                ),
            )
        },
    ),
    # messages squashed onto what the layout put before them: a slot of several roles whose
    # first message joins the header, prefills joined to messages of their role, a layout
    # message that may be empty between slots
    "mixed roles squashed onto the layout": _template(
        [
            _msg("head"),
            {"kind": "slot", "name": "s", "header": {"role": "user", "content": "{{title}}"}},
            _msg("{{missing}}", role="assistant"),
            _msg("{{title}}:", role="assistant", prefix=True),
            {"kind": "slot", "name": "t", "omitIfEmpty": False, "footer": [_msg("foot", role="system")]},
            {"kind": "slot", "name": "s"},
        ],
        {
            "s": _slot(
                _loop("xs", _msg("u {{item}}"), _msg("a {{item}}", role="assistant", prefix=True), limit=3),
                _msg("last", role="assistant"),
            ),
            "t": _slot(_loop("groups", _msg("{{item.name}}", role="system"))),
        },
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_table_cases_render_as_the_closures(name: str) -> None:
    expected, got = _both(CASES[name], _GROUPS, _SOURCES)
    assert got == expected
    assert got[0], "the case renders something"


@pytest.mark.parametrize("budget", [0, 1, 3, None])
@pytest.mark.parametrize("text", ["", "~"])
def test_an_empty_separator_is_no_separator(text: str, budget: int | None) -> None:
    """An interleave separator with empty text never emits, so the loop takes the closures'
    plain-item path (which, out of budget, records the first item not visited): the program
    must take the same one (found by the budgeted property test, budget 0)."""
    template = _template(
        [{"kind": "slot", "name": "s"}],
        {
            "s": _slot(
                _loop("xs", _msg("{{item}}", role="system"), interleave={"kind": "separator", "text": text})
            )
        },
    )
    expected, got = _both(template, {"xs": ["aaaa", "b"]}, budget=budget)
    assert got == expected


# Items of every outcome, with shorter ones after each: a loop records its items' usual
# outcome as its buffer's texts (storyforge.engine.trace.RUN), so every other outcome must cut
# that record and resume it at the right item and separator.
_OUTCOMES = [
    {"t": "a", "sep": "-"},
    {"t": "b" * 40, "sep": ""},  # too long for a small budget; an empty separator
    {"t": "c", "sep": "=" * 40},  # a separator too long for a small budget
    {"t": "d", "sep": "-"},
    {"t": "{{title}}", "sep": "-"},  # data that looks like a template: rendered in its scope
    {"t": "e", "sep": "-"},
    {"t": "z" * 60, "sep": "-"},  # surely too long once an item did not fit: passed over
    {"t": "f", "sep": "-"},
    {"t": 1.5, "sep": "-"},  # a float: the general rules
    {"t": "g", "sep": "-"},
    {"t": "", "sep": "-"},  # empty
    {"t": "h", "sep": "-"},
    {"name": "no t", "sep": "+"},  # a missing key
    {"t": "i", "sep": "-"},
]


@pytest.mark.parametrize("budget", [None, 4, 12, 60])
@pytest.mark.parametrize("local", [None, 7, 20])
@pytest.mark.parametrize("interleave", [None, "{{item.sep}}", "~"])
@pytest.mark.parametrize("stop", [True, False])
@pytest.mark.parametrize("skip_empty", [True, False])
@pytest.mark.parametrize("fill", ["append", "prepend"])
def test_a_loop_records_every_outcome_as_the_closures(
    budget: int | None, local: int | None, interleave: str | None, stop: bool, skip_empty: bool, fill: str
) -> None:
    """Every item outcome (rendered, over budget, empty, out of budget, passed over, rendered
    in its own scope) and separator outcome (rendered, over budget, empty) followed by more
    items: the same messages and trace (each event's item index, cost and reason) as the
    closures."""
    extra: dict[str, Any] = {"fillDir": fill, "stopWhenOutOfBudget": stop}
    if interleave is not None:
        extra["interleave"] = {"kind": "separator", "text": interleave}
    if local is not None:
        extra["budget"] = {"maxTokens": local}
    loop = _loop("xs", _msg("{{item.t}}", skipIfEmptyInterpolation=skip_empty), **extra)
    template = _template([_msg("head"), {"kind": "slot", "name": "s"}], {"s": _slot(loop)})
    expected, got = _both(template, {"xs": _OUTCOMES, "title": "T"}, _SOURCES, budget=budget)
    assert got == expected
    loops = [e for e in got[2]["events"] if e["kind"] in ("message", "separator") and e["loop"]]
    assert loops, "the loop records its items"


def test_a_pickled_result_keeps_its_trace() -> None:
    """A result sent to another process (pickled) reads the same trace: the markers of a
    loop's record load as the same objects."""
    template = _template(
        [{"kind": "slot", "name": "s"}],
        {"s": _slot(_loop("xs", _msg("- {{item.t}}"), interleave={"kind": "separator", "text": "~"}))},
    )
    compiled = _compile(template, True)
    for budget in (None, 12):
        result = render(compiled, {"xs": _OUTCOMES, "title": "T"}, _SOURCES, budget=budget)
        loaded = pickle.loads(pickle.dumps(result))
        assert loaded.messages == result.messages
        assert loaded.trace.to_dict() == result.trace.to_dict()
        assert [e for e in loaded.trace.raw if e[0] == "separator"]


_ABSENT = _template(
    [_msg("[{{missing}}] [{{ctx.title}}]"), _msg("<{{item.name}}>"), {"kind": "slot", "name": "s"}],
    {
        "s": _slot(
            _loop("items", _msg("({{item.name}})", role="system")),
            _loop("items", _msg("{{item.name}}|{{item.text}}", role="assistant")),
        )
    },
)
_ITEMS = SourceRegistry(
    {"items": lambda ctx, args: [{"name": "a", "text": "b"}, {}, "s", 7, 2.5, None, True, ["l"]]}
)


@pytest.mark.parametrize(
    "ctx",
    [
        param({}, id="found-nowhere"),
        param({"title": "T"}, id="ctx-key"),
        param(
            {"globals": {"missing": "g", "item": {"name": "gi"}, "ctx": {"title": "gt"}}}, id="from-globals"
        ),
        param({"ctx": {"title": "inner"}, "title": "outer"}, id="a-key-named-ctx"),
    ],
)
def test_a_path_found_nowhere_renders_empty_unless_globals_hold_it(ctx: Any) -> None:
    """A missing key, or ``{{item.key}}`` of an item without keys, renders empty inline; with
    ``ctx.globals`` the whole path is looked up there, and a key named ``ctx`` is the root of
    ``{{ctx.key}}``, as the closures do."""
    closures, generated = _compile(_ABSENT, False), _compile(_ABSENT, True)
    assert _outcome(generated, ctx, _ITEMS) == _outcome(closures, ctx, _ITEMS)


def test_paths_found_nowhere_render_empty() -> None:
    messages = render(_compile(_ABSENT, True), {}, _ITEMS).messages
    assert messages == [
        {"role": "user", "content": "[] []\n<>"},
        {"role": "system", "content": "(a)\n()\n()\n()\n()\n()\n()\n()"},
        {"role": "assistant", "content": "a|b\n|\n|\n|\n|\n|\n|\n|"},
    ]


_BLOCK_LEAVES = [
    "{{#if item}}has {{item}}{{else}}none{{/if}}",
    "{{#if item.name}}[{{item.name}}]{{/if}}",
    "{{#if item}} {{/if}}",
    "{{#if item}}x{{/if}}",
    "{{#if title}}{{title}}: {{/if}}{{item}}",
    "{{#if ctx.title}}{{ctx.title}}{{else}}{{item.name}}|{{missing}}{{/if}}",
    "{{ item | upper }}",
    "<{{ item.name | lower | trim }}> {{ title | upper }}",
    "{{#if item}}[{{ item | trim }}]{{/if}}",
    "{{target.name}}/{{ target.name | upper }}/{{globals.title}}",
    "{{#if target.flag}}{{item}}{{else}}{{target.missing}}-{{/if}}",
]
_BLOCKS = _template(
    [_msg("{{#if title}}T={{title}}{{else}}no title{{/if}}"), {"kind": "slot", "name": "s"}],
    {
        "s": _slot(
            *(
                _loop("items", _msg(leaf, role="system", skipIfEmptyInterpolation=True), limit=20)
                for leaf in _BLOCK_LEAVES
            )
        )
    },
)
_BLOCK_ITEMS = SourceRegistry(
    {
        "items": lambda ctx, args: [
            "x", "", " ", 0, 3, None, True, False, [], ["l"], {}, {"name": "n"}, {"name": ""},
            {"name": "{{title}}"}, 2.5, float("nan"), " Straße ", {"name": " MiXed "},
        ]
    }
)  # fmt: skip


@pytest.mark.parametrize(
    "ctx",
    [
        param({}, id="empty"),
        param({"title": "T"}, id="title"),
        param({"title": 0}, id="falsy-title"),
        param({"globals": {"title": "G", "item": {"name": "gn"}}}, id="globals"),
        param({"ctx": {"title": "inner"}}, id="a-key-named-ctx"),
        param({"target": {"name": "Tess", "flag": 1}}, id="nested-keys"),
        param(
            {"target": {"name": "Tess", "flag": 1}, "globals": {"title": "G"}}, id="nested-keys-and-globals"
        ),
        param({"target": {"name": None, "flag": ""}}, id="nested-none-and-falsy"),
        param({"target": ["l"], "globals": {"target": {"name": "gn"}}}, id="nested-list-and-globals"),
        param({"target": "text"}, id="nested-in-a-string"),
    ],
)
def test_if_blocks_in_leaves_render_as_the_closures(ctx: Any) -> None:
    """Leaves with {{#if}} blocks (tests and branches of plain placeholders), with the text
    filters upper, lower and trim, and with two-key paths from the context are filled inline: the same texts, skips for no
    content (a taken branch's literal text counts) and the same trace, over values of every
    kind."""
    closures, generated = _compile(_BLOCKS, False), _compile(_BLOCKS, True)
    expected = _outcome(closures, ctx, _BLOCK_ITEMS)
    assert _outcome(generated, ctx, _BLOCK_ITEMS) == expected
    assert expected[0], "the case renders something"


def test_prepend_groups_keep_their_inner_order() -> None:
    messages = render(_compile(CASES["prepend groups"], True), _GROUPS, _SOURCES).messages
    assert messages == [{"role": "user", "content": "c\n- c1\nb\na\n- a1\n- a2"}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=templates(budgets=BUDGETS), ctx=CONTEXTS)
def test_slot_and_node_budgets_with_no_global_budget_render_as_the_closures(
    template: dict[str, Any], ctx: dict[str, Any]
) -> None:
    """With no global budget, slot and node ``maxTokens`` still count: the program for renders
    with no budget counts under them exactly as the closures do (every cost, every skip)."""
    expected, got = _both(template, ctx)
    assert got == expected


def _characters(text: str) -> int:
    return len(text)


_SCOPED = _template(
    [{"kind": "slot", "name": "s"}],
    {"s": _slot(_loop("xs", _msg("{{item}}")), _msg("tail"), budget={"maxTokens": 3})},
)


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # "aaaa" costs 1 token, "bbbbbbbb" 2: the slot's 3 are spent; "c" and "tail" are left out
        (None, ["aaaa\nbbbbbbbb"]),
        # one token a character: only "c" (1) fits the 3; "tail" (4) no longer does
        (_characters, ["c"]),
    ],
    ids=["default", "characters"],
)
def test_slot_budgets_with_no_global_budget_count_with_the_render_estimator(
    estimator: Any, expected: list[str]
) -> None:
    """The program counts with the default estimator; a render with another one takes the
    closures, so a slot budget is counted with the estimator the render was given."""
    compiled, closures = _compile(_SCOPED, True), _compile(_SCOPED, False)
    program = compiled.program.generated.get(False)
    assert program is not None and program.counts
    ctx = {"xs": ["aaaa", "bbbbbbbb", "c"]}
    got = render(compiled, ctx, _SOURCES, estimator=estimator)
    want = render(closures, ctx, _SOURCES, estimator=estimator)
    assert [m["content"] for m in got.messages] == expected
    assert (got.messages, got.warnings, got.trace.to_dict()) == (
        want.messages,
        want.warnings,
        want.trace.to_dict(),
    )


def test_templates_without_budgets_count_nothing_and_budgeted_renders_match() -> None:
    compiled = _compile(CASES["one role, squashed at generation"], True)
    program = compiled.program.generated.get(False)
    assert program is not None and not program.counts
    closures = _compile(CASES["one role, squashed at generation"], False)
    for budget in (0, 3, 12, 1000):
        assert _outcome(compiled, _GROUPS, _SOURCES, budget) == _outcome(closures, _GROUPS, _SOURCES, budget)


def _nested(depth: int, budget: dict[str, Any] | None) -> dict[str, Any]:
    node: dict[str, Any] = _msg("x{{item}}")
    for _ in range(depth):
        node = _loop("xs", node, _msg("y"), **({"budget": budget} if budget else {}))
    return _template([{"kind": "slot", "name": "s"}], {"s": _slot(node)})


@pytest.mark.parametrize("depth", [3, 12, 24])
@pytest.mark.parametrize("budget", [None, 40])
def test_nesting_deeper_than_python_allows_renders_through_the_closures(
    depth: int, budget: int | None
) -> None:
    """About 20 nested loops are more blocks than Python's compiler takes: such a template
    has no generated program and renders through the closures, with the same result."""
    template = _nested(depth, {"maxTokens": 30} if budget else None)
    expected, got = _both_maybe(template, budget)
    assert got == expected
    generated = _compile(template, True).program.generated
    program = generated.get(budget is not None)
    if depth == 3:
        assert program is not None
    if depth == 24:
        assert program is None


def _both_maybe(template: dict[str, Any], budget: int | None) -> tuple[Any, Any]:
    registry = SourceRegistry({"xs": lambda ctx, args: ["a"]})
    closures, generated = _compile(template, False), _compile(template, True)
    return _outcome(closures, {}, registry, budget), _outcome(generated, {}, registry, budget)


@pytest.mark.parametrize("budget", [None, 400])
def test_a_template_too_long_for_a_program_renders_through_the_closures(budget: int | None) -> None:
    """A template of hundreds of messages would make a program past plangen.MAX_LINES (Python
    compiles one very long function slowly): it has none and renders as the closures do; a
    shorter one of the same kind keeps its program."""
    registry = SourceRegistry({"xs": lambda ctx, args: ["a"]})

    def many(count: int) -> dict[str, Any]:
        layout = [
            {
                "kind": "message",
                "role": "user" if i % 3 else "assistant",
                "content": f"m{i} {{{{x}}}} {{{{y}}}}",
            }
            for i in range(count)
        ]
        return _template(layout, {})

    ctx = {"x": "1", "y": 2}
    for count, has_program in ((20, True), (1000, False)):
        template = many(count)
        closures, generated = _compile(template, False), _compile(template, True)
        assert (generated.program.generated.get(budget is not None) is not None) is has_program
        assert _outcome(generated, ctx, registry, budget) == _outcome(closures, ctx, registry, budget)


def test_output_limit_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _compile(CASES["one role, squashed at generation"], True)
    monkeypatch.setitem(compiled.program.generated.get(False).__globals__, "_max_out", 10)
    with pytest.raises(RenderLimitError, match="above MAX_OUTPUT_CHARS"):
        render(compiled, _GROUPS, _SOURCES)


# -- no template text in the generated source --------------------------------------------------

_HOSTILE = st.sampled_from(
    [
        '"',
        "'",
        '"""',
        "\\",
        "\n",
        "{",
        "}",
        "%s",
        "#",
        "__import__('os')",
        "'); raise SystemExit('",
        "c0",
        "ev",
        "st",
        "_None",
    ]
)
_hostile_text = st.lists(
    st.one_of(
        _HOSTILE,
        st.sampled_from(
            ["{{item}}", "{{item.k}}", "{{k}}", "{{ctx.k}}", "{{#if k}}{{item.k}}{{else}}-{{/if}}"]
        ),
    ),
    max_size=6,
).map("".join)
_GENERATED = re.compile(r"(c|v|t|h|b|i|s|m|e|ok|item|items|acc|starts|last|left)[0-9]+")
_ALLOWED = {
    "program", "st", "ctx", "size", "pend", "handlers", "estimate", "events", "warnings", "ev", "out", "text",
    "contentful", "exc", "sep", "_", "end", "start", "append", "get", "frames", "for_program", "cur",
    "__class__", "strip", "extend", "join", "isascii", "encode", "gmax", "consumed", "cost",
    "room", "limit", "tight", "passed", "first", "floor", "visited", "chars", "item",
    "index", "total", "message", "result", "messages", "_events", "_info", "_trace", "events_of", "x",
    *plangen._HELPERS,
}  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(content=_hostile_text, key=_HOSTILE, source=_HOSTILE)
def test_no_template_text_in_generated_source(content: str, key: str, source: str) -> None:
    template = _template(
        [_msg(content), {"kind": "slot", "name": key, "header": {"role": "system", "content": content}}],
        {
            key: _slot(
                _loop(source, _msg(content), limit=2),
                {"kind": "message", "role": "user", "from": {"source": source, "args": {key: content}}},
            )
        },
    )
    compiled = _compile(template, True)
    for program in (compiled.program.generated.get(False), compiled.program.generated.get(True)):
        _check_tokens(program.source)


def _check_tokens(source: str) -> None:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            assert (
                keyword.iskeyword(token.string)
                or token.string in _ALLOWED
                or _GENERATED.fullmatch(token.string)
            ), token
        elif token.type == tokenize.STRING:
            assert re.fullmatch(
                r'f"(\{([ctv][0-9]+|_repr\(v[0-9]+\)|_empty|_nl|text|cur\[c[0-9]+\])\})*"', token.string
            ), token
        elif token.type == tokenize.COMMENT:
            assert re.fullmatch(r"# slot c[0-9]+", token.string), token
        else:
            assert token.type in (
                tokenize.OP, tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                tokenize.ENDMARKER, tokenize.NUMBER,
            ), token  # fmt: skip


def test_generated_source_is_shown() -> None:
    compiled = _compile(CASES["one role, squashed at generation"], True)
    shown = compiled.generated_source()
    assert "def program(ctx, handlers, estimate):" in shown
    assert "def leaf(item, ctx):" in shown


def _if_eq(source: str, path: str, kind: str, value: Any = None) -> dict[str, Any]:
    when: dict[str, Any] = {"type": kind, "ref": {"source": source, "args": {"path": path}}}
    if kind in ("eq", "neq"):
        when["value"] = value
    label = f"{source}.{path} {kind} {value!r}".replace("{", "(")
    return {"kind": "if", "when": when, "then": [_msg(f"{label}: yes")], "else": [_msg(f"{label}: no")]}


_REF_CONDITIONS = [
    ("$item", "name", "eq", "n"),
    ("$item", "name", "neq", "n"),
    ("$item", "name", "eq", 3),
    ("$item", "name", "exists"),
    ("$item", "name.0", "nonEmpty"),
    ("$item", "name.length", "eq", 1),
    ("$ctx", "target.name", "eq", "Tess"),
    ("$ctx", "target.name", "nonEmpty"),
    ("$ctx", "target", "exists"),
    ("$ctx", "a.b.c.d", "eq", "deep"),
    ("$ctx", "a.b.c.d.e", "eq", "deeper"),
]
_REF_PATHS = _template(
    [{"kind": "slot", "name": "s"}],
    {
        "s": _slot(
            _if_eq("$ctx", "target.name", "eq", "Tess"),
            _loop("items", *(_if_eq(*spec) for spec in _REF_CONDITIONS), limit=20),
        )
    },
)
_REF_ITEMS = SourceRegistry(
    {
        "items": lambda ctx, args: [
            {"name": "n"}, {"name": "m"}, {"name": 3}, {"name": 3.0}, {"name": None}, {"name": ["l"]},
            {"name": {"0": "k"}}, {}, "n", 3, None, ["n"], {"other": 1},
        ]
    }
)  # fmt: skip


@pytest.mark.parametrize(
    "ctx",
    [
        param({}, id="empty"),
        param({"target": {"name": "Tess"}}, id="target"),
        param({"target": {"name": ""}, "a": {"b": {"c": {"d": "deep"}}}}, id="deep"),
        param({"target": ["Tess"], "a": {"b": {"c": {"d": {"e": "deeper"}}}}}, id="list-and-deeper"),
        param({"target": "Tess", "a": {"b": [{"d": "deep"}]}}, id="string-and-list-on-the-way"),
        param({"globals": {"target": {"name": "Tess"}}}, id="globals-not-consulted"),
    ],
)
def test_reserved_ref_paths_and_string_comparisons_render_as_the_closures(ctx: Any) -> None:
    """Conditions on ``$item`` and ``$ctx`` paths of up to four plain keys walk dicts inline,
    and ``eq``/``neq`` against a string compare strings inline; everything else (lists,
    numbers, missing keys, longer paths) takes the runtime's functions: the same messages and
    trace as the closures for values of every kind."""
    closures, generated = _compile(_REF_PATHS, False), _compile(_REF_PATHS, True)
    expected = _outcome(closures, ctx, _REF_ITEMS)
    assert _outcome(generated, ctx, _REF_ITEMS) == expected
    assert expected[0], "the case renders something"
    lines = generated.program.generated.get(False).source.splitlines()
    general = [
        i
        for i, line in enumerate(lines)
        if "_reserved(" in line and not lines[i - 1].endswith("is not _dict:")
    ]
    assert len(general) == 1, "only the five-key path resolves through the runtime first"


_DISTINCT_ROLES = {
    "system and user": [_msg("rules", role="system"), _msg("{{item}} says {{title}}")],
    "from a source, a prefill": [
        {"kind": "message", "role": "system", "from": {"source": "json"}},
        _msg("{{title}}"),
        _msg("{{secret}}:", role="assistant", prefix=True),
    ],
    "empty and failing": [
        {"kind": "message", "role": "system", "from": {"source": "boom"}},
        _msg("{{missing}}", role="assistant"),
        _msg("", role="user"),
    ],
}


@pytest.mark.parametrize("budget", [None, 0, 4, 400])
@pytest.mark.parametrize("name", list(_DISTINCT_ROLES))
def test_layouts_of_distinct_roles_render_as_the_closures(name: str, budget: int | None) -> None:
    """A layout of messages only, each role once, has nothing to squash: the program writes
    the finished messages (same messages, warnings and trace as the closures)."""
    template = _template(_DISTINCT_ROLES[name], {})
    expected, got = _both(template, _GROUPS, _SOURCES, budget)
    assert got == expected
    source = _compile(template, True).program.generated.get(budget is not None).source
    assert "_squash" not in source


_FROM_SOURCES = SourceRegistry(
    {
        "str": lambda ctx, args: "a text",
        "empty": lambda ctx, args: "",
        "none": lambda ctx, args: None,
        "num": lambda ctx, args: 3,
        "boom": lambda ctx, args: 1 / 0,
    }
)


@pytest.mark.parametrize("source", ["str", "empty", "none", "num", "boom", "unknown"])
@pytest.mark.parametrize("before", ["user", "system", None])
@pytest.mark.parametrize("budget", [None, 2, 100])
def test_a_message_from_data_joins_as_the_closures(
    source: str, before: str | None, budget: int | None
) -> None:
    """A layout message ``from`` a source (a string, empty, nothing, a number, a failing or
    unknown source) between messages of its role and another: the program squashes the
    messages around it as the closures do, whether it was emitted or skipped."""
    layout = [_msg("first", role=before)] if before is not None else []
    layout += [
        {"kind": "message", "role": "system", "from": {"source": source}},
        _msg("after", role="system"),
    ]
    expected, got = _both(_template(layout, {}), {}, _FROM_SOURCES, budget=budget)
    assert got == expected


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("header", [False, True])
@pytest.mark.parametrize("items", [[], ["a"], ["a", "b", "c"]])
@pytest.mark.parametrize("budget", [None, 3, 100])
def test_a_slot_of_the_last_messages_role_joins_as_the_closures(
    prefix: bool, header: bool, items: list[str], budget: int | None
) -> None:
    """A slot whose messages all have the role of the message before it (surely joined onto
    that message, a prefilled assistant turn included), then one more of that role: the same
    messages and trace as the closures."""
    role = "assistant" if prefix else "user"
    shown: dict[str, Any] = {"kind": "slot", "name": "s"}
    if header:
        shown["header"] = {"role": role, "content": "header"}
    layout = [_msg("head", role=role), shown, _msg("tail {{title}}", role=role)]
    loop = _loop("xs", _msg("- {{item}}", role=role, prefix=prefix))
    expected, got = _both(
        _template(layout, {"s": _slot(loop)}), {"xs": items, "title": "T"}, _SOURCES, budget
    )
    assert got == expected
    if budget is None:
        assert got[0][0]["content"].startswith("head")


def _with_output_limit(monkeypatch: pytest.MonkeyPatch, limit: int, template: dict[str, Any]) -> Any:
    """``template`` compiled to a program generated under an output limit of ``limit``."""
    monkeypatch.setitem(plangen._HELPERS, "_max_out", limit)
    return _compile(template, True)


def test_output_limit_holds_for_layouts_of_distinct_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    template = _template(_DISTINCT_ROLES["system and user"], {})
    with pytest.raises(RenderLimitError, match="above MAX_OUTPUT_CHARS"):
        render(_with_output_limit(monkeypatch, 11, template), _GROUPS, _SOURCES)
    compiled = _with_output_limit(monkeypatch, 12, template)
    assert render(compiled, _GROUPS, _SOURCES).messages[1]["content"] == " says T"


@pytest.mark.parametrize(
    ("layout", "plan", "counts"),
    [
        param([_msg("rules", role="system"), _msg("{{item}} says {{title}}")], [], False, id="leaves"),
        param([_msg("a"), {"kind": "slot", "name": "s"}], [_msg("{{title}}")], False, id="slot leaf"),
        param(
            [{"kind": "slot", "name": "s"}],
            [{"kind": "if", "when": "title", "then": [_msg("{{title}}")], "else": [_msg("x")]}],
            False,
            id="branches",
        ),
        param([{"kind": "message", "role": "user", "from": {"source": "xs"}}], [], True, id="text from data"),
        param([{"kind": "slot", "name": "s"}], [_loop("xs", _msg("{{item}}"))], True, id="loop"),
        # eight leaves of up to a million characters each, shown twice: could pass the limit
        param(
            [{"kind": "slot", "name": "s"}, {"kind": "slot", "name": "s"}],
            [_msg("{{title}}")] * 8,
            True,
            id="many leaves",
        ),
    ],
)
def test_only_a_render_that_could_pass_the_output_limit_counts(
    layout: list[Any], plan: list[Any], counts: bool
) -> None:
    """A template with no loop and no text from data emits each message at most once, each
    text at most a leaf's limit: when that cannot come near MAX_OUTPUT_CHARS its program counts
    no characters; any other counts every text (and renders as the closures)."""
    template = _template(layout, {"s": _slot(*plan)} if plan else {})
    compiled = _compile(template, True)
    for budgeted in (False, True):
        source = compiled.program.generated.get(budgeted).source
        assert ("chars" in source) is counts
        assert ("_max_out" in source) is counts
    for budget in (None, 3, 100):
        expected, got = _both(template, _GROUPS, _SOURCES, budget=budget)
        assert got == expected


def test_generated_results_set_every_slot_of_the_result() -> None:
    """A program makes its RenderResult without ``__init__``, setting the slots itself: every
    one of them, so the result reads as one made by the constructor."""
    from storyforge.engine.renderer import RenderResult

    source = _compile(CASES["one role, squashed at generation"], True).program.generated.get(False).source
    assert set(RenderResult.__slots__) == {
        name for name in RenderResult.__slots__ if f"result.{name} = " in source
    }
    result = render(_compile(CASES["one role, squashed at generation"], True), _GROUPS, _SOURCES)
    assert result.messages and result.warnings == [] and result.trace.events


def test_generated_loop_scopes_set_every_slot_of_the_scope() -> None:
    """A loop item's scope is made without ``__init__`` too: every slot set."""
    from storyforge.engine.runtime import Scope

    source = _compile(CASES["prepend groups"], True).program.generated.get(False).source
    made = re.findall(r"^ *(s\d+) = _new\(_Scope\)$", source, re.MULTILINE)
    assert made
    for name in made:
        assert {slot for slot in Scope.__slots__ if f"{name}.{slot} = " in source} == set(Scope.__slots__)


class _Text(str):
    """A string of another class: decided by the runtime's functions, not inline."""


class _Number(int):
    """An int of another class."""


_CONDITION_VALUES = [
    None, True, False, 0, 3, 3.0, 2.5, float("nan"), float("inf"), "", "x", _Text("x"), _Number(3),
    [], [1], ["x"], (), {}, {"a": 1}, [[]],
]  # fmt: skip
_EXPECTED = [None, "x", "", 0, 3, 2.5, [], ["x"], True, {"a": 1}]
_CONDITIONS = _template(
    [{"kind": "slot", "name": "s"}],
    {
        "s": _slot(
            _loop(
                "values",
                *(
                    {
                        "kind": "if",
                        "when": {
                            "type": kind,
                            "ref": {"source": "$item"},
                            **({"value": v} if v != "-" else {}),
                        },
                        "then": [_msg(f"{kind} {n} yes")],
                        "else": [_msg(f"{kind} {n} no")],
                    }
                    for kind in ("eq", "neq", "gt", "lt")
                    for n, v in enumerate([*_EXPECTED, "-"])
                ),
                {
                    "kind": "if",
                    "when": {"type": "nonEmpty", "ref": {"source": "$item"}},
                    "then": [_msg("non-empty")],
                },
            ),
            {
                "kind": "if",
                "when": {"type": "nonEmpty", "ref": {"source": "nothing"}},
                "then": [_msg("unknown source non-empty")],
            },
        )
    },
)


def test_conditions_decided_inline_render_as_the_closures() -> None:
    """``eq``/``neq`` against null, a string, a number or an empty list, ``gt``/``lt``
    against a number or a non-number and ``nonEmpty`` are decided inline for values of the
    plain classes and by the runtime's functions for any other: the same outcome as the
    closures for every pair (strings and ints of other classes, NaN, nested lists, no value)."""
    registry = SourceRegistry({"values": lambda ctx, args: _CONDITION_VALUES})
    closures, generated = _compile(_CONDITIONS, False), _compile(_CONDITIONS, True)
    expected = _outcome(closures, {}, registry)
    assert _outcome(generated, {}, registry) == expected
    assert "eq 1 yes" in expected[0][0]["content"] and "gt 4 yes" in expected[0][0]["content"]


_PLAIN_VALUES = st.one_of(
    st.sampled_from(
        [None, 0, 7, "", "plain", "{{b}}", "{ a }", "{{", "x{{a}}y", [], ["x"], {"k": 1}, 2.5, True]
    ),
    st.text(alphabet="ab{} ", max_size=8),
)
_STRAIGHT_CONTENTS = st.sampled_from(
    ["static", "{{a}}", "{{a}} and {{b}}", "[{{a}}{{b}}]", "{{ctx.a}}: {{b}}", "{{ a | upper }}-{{b}}", ""]
)


@st.composite
def _message_layouts(draw: st.DrawFn) -> dict[str, Any]:
    """Layouts of messages only: no slots, no branches around them (a message may still
    skip itself, come from a source or join the one before)."""
    layout = []
    for _ in range(draw(st.integers(1, 4))):
        node = {"kind": "message", "role": draw(st.sampled_from(["system", "user", "assistant"]))}
        if draw(st.integers(0, 4)) == 0:
            node["from"] = {"source": draw(st.sampled_from(["text", "num", "none", "bad", "nothing"]))}
        else:
            node["content"] = draw(_STRAIGHT_CONTENTS)
        if draw(st.integers(0, 3)) == 0:
            node["skipIfEmptyInterpolation"] = True
        layout.append(node)
    return _template(layout, {})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    template=_message_layouts(),
    ctx=st.dictionaries(st.sampled_from(["a", "b", "globals"]), _PLAIN_VALUES, max_size=3),
)
def test_layouts_of_messages_render_as_the_closures(template: dict[str, Any], ctx: dict[str, Any]) -> None:
    """A layout of messages only (where the program builds its messages and events once, at
    the end, when every message is always shown), with values of every kind in the data:
    the same messages, warnings and trace as the closures, also once pickled."""
    expected, got = _both(template, ctx)
    assert got == expected
    result = render(_compile(template, True), ctx, REGISTRY)
    loaded = pickle.loads(pickle.dumps(result))
    assert _outcome_of(loaded) == got


def _outcome_of(result: Any) -> Any:
    return result.messages, result.warnings, result.trace.to_dict(), result.trace.format()


_STRAIGHT = {
    "a fixed message, then one of two placeholders": (
        [_msg("You judge.", role="system"), _msg("Q: {{a}}\nA: {{b}}")],
        True,
    ),
    "three roles, one placeholder each": (
        [_msg("S: {{a}}", role="system"), _msg("Q: {{b}}"), _msg("[{{a}}]", role="assistant")],
        True,
    ),
    "a message that renders empty is skipped": ([_msg("x", role="system"), _msg("{{a}}")], False),
    "two messages of one role join": ([_msg("{{a}}"), _msg("{{b}}")], False),
    "a message that may skip itself": (
        [_msg("x", role="system"), _msg("{{a}}", skipIfEmptyInterpolation=True)],
        False,
    ),
    "a message from a source": (
        [_msg("x", role="system"), {"kind": "message", "role": "user", "from": {"source": "text"}}],
        False,
    ),
    "a slot": ([_msg("x", role="system"), {"kind": "slot", "name": "s"}], False),
}


@pytest.mark.parametrize("name", list(_STRAIGHT))
def test_messages_always_shown_are_built_once_at_the_end(name: str) -> None:
    """Where every message is always shown, the program builds the messages as one list and
    the events as one tuple at the end (no append); anywhere else as it goes. Both render as
    the closures, for plain strings, values the general rules decide and missing keys."""
    layout, straight = _STRAIGHT[name]
    slots = {"s": _slot(_msg("in the slot"))} if any(node["kind"] == "slot" for node in layout) else {}
    template = _template(layout, slots)
    source = _compile(template, True).program.generated.get(False).source
    assert ("events = (events_of" in source) is straight
    assert ("out.append" not in source and "events.append" not in source) is straight
    for ctx in ({"a": "one", "b": "two"}, {"a": 3, "b": None}, {"a": "{{b}}", "b": "x"}, {}, {"a": [1]}):
        expected, got = _both(template, ctx)
        assert got == expected
