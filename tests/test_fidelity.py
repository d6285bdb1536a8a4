"""Cases where the reference and storyforge used to differ, each pinned by a full render.

A missing value is not null in conditions (decision #20); ``from`` writes NaN and infinities
as JSON ``null`` (#22); a circular ``from`` value emits nothing, with a warning (#23); an empty
source name is a name like any other; path segments starting with ``__`` are plain keys (#25).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import param

from storyforge import SourceRegistry, compile_template, render


def _doc(slot: dict[str, Any], layout: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "id": "t",
        "name": "t",
        "task": "x",
        "version": 1,
        "layout": layout if layout is not None else [{"kind": "slot", "name": "s"}],
        "slots": {"s": {"priority": 0, **slot}},
    }


def _when(condition: dict[str, Any]) -> dict[str, Any]:
    return _doc({"when": condition, "plan": [{"kind": "message", "role": "user", "content": "yes"}]})


def _contents(
    doc: dict[str, Any], ctx: dict[str, Any], handlers: dict[str, Any], budget: int | None = None
) -> list[str]:
    result = render(compile_template(doc), ctx, SourceRegistry(handlers), budget=budget)
    return [m["content"] for m in result.messages]


def _null_source(ctx: Any, args: Any) -> Any:
    return None


def _failing(ctx: Any, args: Any) -> Any:
    raise ValueError("boom")


NULL_VS_MISSING = [
    # the three cases of the differential run
    param(
        {"type": "neq", "ref": {"source": "$ctx", "args": {"path": "title"}}, "value": None},
        {},
        {},
        True,
        id="neq-null-on-absent-path-is-true",
    ),
    param(
        {"type": "eq", "ref": {"source": "nobody"}, "value": None},
        {},
        {},
        False,
        id="eq-null-on-unknown-source-is-false",
    ),
    param(
        {"type": "eq", "ref": {"source": "n"}},
        {},
        {"n": _null_source},
        False,
        id="eq-without-value-on-null-source-is-false",
    ),
    # and their neighbours
    param(
        {"type": "eq", "ref": {"source": "n"}, "value": None},
        {},
        {"n": _null_source},
        True,
        id="eq-null-on-null-source",
    ),
    param(
        {"type": "eq", "ref": {"source": "$ctx", "args": {"path": "title"}}, "value": None},
        {"title": None},
        {},
        True,
        id="eq-null-on-null-key",
    ),
    param(
        {"type": "eq", "ref": {"source": "$ctx", "args": {"path": "title"}}, "value": None},
        {},
        {},
        False,
        id="eq-null-on-absent-path",
    ),
    param({"type": "eq", "ref": {"source": "nobody"}}, {}, {}, True, id="eq-without-value-on-unknown-source"),
    param(
        {"type": "neq", "ref": {"source": "nobody"}}, {}, {}, False, id="neq-without-value-on-unknown-source"
    ),
    param(
        {"type": "eq", "ref": {"source": "bad"}, "value": None},
        {},
        {"bad": _failing},
        False,
        id="eq-null-on-failing-source",
    ),
    param(
        {"type": "eq", "ref": {"source": "$item"}, "value": None},
        {},
        {},
        False,
        id="eq-null-on-item-outside-loop",
    ),
    param({"type": "exists", "ref": {"source": "nobody"}}, {}, {}, False, id="exists-unknown"),
    param({"type": "exists", "ref": {"source": "n"}}, {}, {"n": _null_source}, False, id="exists-null"),
    param('source("nobody") == null', {}, {}, False, id="string-form-eq-null-on-unknown-source"),
    param('source("n") == null', {}, {"n": _null_source}, True, id="string-form-eq-null-on-null-source"),
    param(
        'source("$ctx", {"path": "title"}) != null', {}, {}, True, id="string-form-neq-null-on-absent-path"
    ),
    param('exists(source("nobody"))', {}, {}, False, id="string-form-exists-unknown"),
]


@pytest.mark.parametrize(("condition", "ctx", "handlers", "expected"), NULL_VS_MISSING)
def test_a_missing_value_is_not_null(
    condition: Any, ctx: dict[str, Any], handlers: dict[str, Any], expected: bool
) -> None:
    """Conditions tell an absent DataRef (undefined) from one that resolved to null, as the reference does."""
    assert _contents(_when(condition), ctx, handlers) == (["yes"] if expected else [])


def _from(value: Any) -> Any:
    return lambda ctx, args: value


NON_FINITE = [
    param(math.inf, "null", id="infinity"),
    param(-math.inf, "null", id="minus-infinity"),
    param(math.nan, "null", id="nan"),
    param([1.5, math.inf, math.nan, -math.inf], "[1.5,null,null,null]", id="inside-a-list"),
    param({"a": math.nan, "b": [math.inf]}, '{"a":null,"b":[null]}', id="inside-a-mapping"),
    param(2.0, "2", id="finite-float"),
]


@pytest.mark.parametrize(("value", "expected"), NON_FINITE)
@pytest.mark.parametrize("where", ["plan", "layout", "header"])
def test_non_finite_numbers_through_from_render_null(value: Any, expected: str, where: str) -> None:
    """`from` writes NaN and infinities as JSON null, at the top level and inside containers."""
    block = {"role": "user", "from": {"source": "v"}}
    if where == "plan":
        doc = _doc({"plan": [{"kind": "message", **block}]})
    elif where == "layout":
        doc = _doc({"plan": []}, [{"kind": "message", **block}])
    else:
        doc = _doc(
            {"plan": [{"kind": "message", "role": "user", "content": "body"}]},
            [{"kind": "slot", "name": "s", "header": block}],
        )
    contents = _contents(doc, {}, {"v": _from(value)})
    assert contents[0].split("\n")[0] == expected


def test_non_finite_from_counts_as_null_against_the_budget() -> None:
    """ "null" costs 1 token: it fits a budget of 1, which "Infinity" (2 tokens) would not."""
    doc = _doc({"plan": [{"kind": "message", "role": "user", "from": {"source": "v"}}]})
    assert _contents(doc, {}, {"v": _from(math.inf)}, budget=1) == ["null"]
    result = render(compile_template(doc), {}, SourceRegistry({"v": _from([math.nan] * 3)}), budget=None)
    assert result.trace.to_dict()["budget"]["consumed"] == 4  # "[null,null,null]" is 16 units


def test_circular_from_emits_nothing_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A `from` value that contains itself emits nothing and says so in warnings and the log."""
    circular: dict[str, Any] = {"a": 1}
    circular["self"] = circular
    doc = _doc(
        {
            "plan": [
                {"kind": "message", "role": "user", "from": {"source": "v"}},
                {"kind": "message", "role": "user", "content": "after"},
            ]
        }
    )
    with caplog.at_level("DEBUG", logger="storyforge.engine"):
        result = render(compile_template(doc), {}, SourceRegistry({"v": _from(circular)}))
    assert [m["content"] for m in result.messages] == ["after"]
    assert result.warnings == [
        (
            'slots.s.plan[0]: {"source":"v"} gave a value that contains itself (or is nested too deeply) '
            "and cannot be written as JSON; nothing was emitted"
        )
    ]
    assert result.warnings[0] in caplog.messages


EMPTY_SOURCE = [
    param({"type": "exists", "ref": {"source": ""}}, {"": _from(0)}, True, id="exists-empty-name-handler"),
    param({"type": "exists", "ref": {"source": ""}}, {}, False, id="exists-empty-name-no-handler"),
    param({"type": "eq", "ref": {"source": ""}, "value": "x"}, {"": _from("x")}, True, id="eq-empty-name"),
    param('exists(source(""))', {"": _from(1)}, True, id="string-form"),
]


@pytest.mark.parametrize(("condition", "handlers", "expected"), EMPTY_SOURCE)
def test_empty_source_name_is_accepted_in_conditions(
    condition: Any, handlers: dict[str, Any], expected: bool
) -> None:
    """An empty source name compiles in conditions as it does in `from` and `forEach`."""
    assert _contents(_when(condition), {}, handlers) == (["yes"] if expected else [])


def test_empty_source_name_in_from_and_foreach() -> None:
    """`from` and `forEach` already accepted an empty source name; they still do."""
    doc = _doc(
        {
            "plan": [
                {"kind": "message", "role": "user", "from": {"source": ""}},
                {
                    "kind": "forEach",
                    "source": {"source": ""},
                    "map": [{"kind": "message", "role": "assistant", "content": "{{item}}"}],
                },
            ]
        }
    )
    assert _contents(doc, {}, {"": _from(["a", "b"])}) == ['["a","b"]', "a\nb"]


DUNDER = [
    param(
        "type={{node.__typename}}", {"node": {"__typename": "Character"}}, "type=Character", id="plain-path"
    ),
    param(
        "{{ node.__typename | upper }}", {"node": {"__typename": "Character"}}, "CHARACTER", id="expression"
    ),
    param("{{ __meta__ }}", {"__meta__": "m"}, "m", id="top-level-key"),
    param("[{{ s.__class__ }}]", {"s": "text"}, "[]", id="no-attributes-of-strings"),
    param("[{{ d.__class__ }}]", {"d": {}}, "[]", id="no-attributes-of-mappings"),
    param("[{{ l.__len__ }}]", {"l": [1]}, "[]", id="no-attributes-of-lists"),
    param("[{{ __class__.__name__ }}]", {}, "[]", id="no-attributes-at-the-root"),
    param("[{{ $item.__class__ }}]", {}, "[]", id="no-attributes-of-reserved"),
]


@pytest.mark.parametrize(("content", "ctx", "expected"), DUNDER)
def test_double_underscore_segments_are_plain_keys(content: str, ctx: dict[str, Any], expected: str) -> None:
    """Segments starting with `__` read mapping keys (GraphQL's __typename); never attributes."""
    doc = _doc({"plan": []}, [{"kind": "message", "role": "user", "content": content}])
    assert _contents(doc, ctx, {}) == ([expected] if expected != "[]" else ["[]"])


def test_double_underscore_in_conditions() -> None:
    """A string condition may read a `__` key too."""
    doc = _when("node.__typename == 'Character'")  # type: ignore[arg-type]
    assert _contents(doc, {"node": {"__typename": "Character"}}, {}) == ["yes"]
    assert _contents(doc, {"node": {}}, {}) == []


def test_consumed_equals_tokens_emitted_when_the_budget_is_unlimited() -> None:
    """Without a budget, the trace's `consumed` still counts every emitted token (as a huge budget does)."""
    doc = {
        "id": "t",
        "name": "t",
        "task": "x",
        "version": 1,
        "layout": [
            {"kind": "message", "role": "system", "content": "You are a narrator of long stories."},
            {"kind": "slot", "name": "a", "header": {"role": "user", "content": "Turns {{n}}:"}},
            {"kind": "slot", "name": "b"},
        ],
        "slots": {
            "a": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "$ctx", "args": {"path": "turns"}},
                        "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                        "interleave": {"kind": "separator", "text": "--"},
                    }
                ],
            },
            "b": {
                "priority": 1,
                "budget": {"maxTokens": 1000},
                "plan": [{"kind": "message", "role": "assistant", "content": "{{n}} turns in all"}],
            },
        },
    }
    ctx = {"turns": [f"turn number {i} " * (i + 1) for i in range(12)], "n": 12}
    unlimited = render(compile_template(doc), ctx).trace
    counted = render(compile_template(doc), ctx, budget=10**9).trace
    assert unlimited.consumed == counted.consumed == unlimited.to_dict()["budget"]["consumed"]
    assert unlimited.consumed == sum(e.tokens for e in unlimited.events if e.status == "rendered")
    assert unlimited.consumed > 100


def _layout_doc(system: str, slot_max: int | None) -> dict[str, Any]:
    slot: dict[str, Any] = {
        "priority": 0,
        "plan": [
            {
                "kind": "forEach",
                "source": {"source": "$ctx", "args": {"path": "turns"}},
                "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
            }
        ],
    }
    if slot_max is not None:
        slot["budget"] = {"maxTokens": slot_max}
    return {
        "id": "fit",
        "name": "fit",
        "task": "x",
        "version": 1,
        "layout": [
            {"kind": "message", "role": "system", "content": system},
            {
                "kind": "slot",
                "name": "history",
                "header": {"role": "user", "content": "## History"},
                "footer": {"role": "user", "content": "## End of history, {{name}}"},
            },
        ],
        "slots": {"history": slot},
    }


_LEFT = "of the 12-token budget remained"
_USED = "the 10-token budget was used up before it (slots are filled first)"

DROPS = [
    param(
        "S" * 40,
        None,
        12,
        [
            f"layout[0]: layout message dropped: it needs 10 tokens but only 2 {_LEFT}",
            f"layout[1].header: header dropped: it needs 3 tokens but only 2 {_LEFT}",
            f"layout[1].footer: footer dropped: it needs 6 tokens but only 2 {_LEFT}",
        ],
        id="slots-crowd-out-system-header-and-footer",
    ),
    param(
        "S" * 4,
        None,
        10,
        [
            f"layout[0]: layout message dropped: {_USED}",
            f"layout[1].header: header dropped: {_USED}",
            f"layout[1].footer: footer dropped: {_USED}",
        ],
        id="budget-used-up",
    ),
    param("S" * 4, 4, 14, [], id="slot-ceiling-leaves-room"),
    param(
        "S" * 4,
        6,
        12,
        [f"layout[1].footer: footer dropped: it needs 6 tokens but only 2 {_LEFT}"],
        id="footer",
    ),
]


@pytest.mark.parametrize(("system", "slot_max", "budget", "warnings"), DROPS)
def test_dropping_a_layout_block_warns(
    system: str, slot_max: int | None, budget: int, warnings: list[str]
) -> None:
    """A layout message, header or footer that the slots left no room for is a warning, not silence."""
    ctx = {"turns": ["t" * 8] * 5, "name": "Ann"}  # 2 tokens per turn
    result = render(compile_template(_layout_doc(system, slot_max)), ctx, budget=budget)
    assert result.warnings == warnings
    dropped = [
        e for e in result.trace.events if e.kind in ("layout", "header", "footer") and e.status == "skipped"
    ]
    assert len(dropped) == len(warnings)


FEASIBILITY = [
    param(
        "S" * 80,
        None,
        10,
        "needs at least 28 tokens, more than the whole 10-token budget",
        id="fixed-over-budget",
    ),
    param(
        "S" * 8,
        30,
        20,
        "maxTokens add up to 30: history (30). Keep the slots' maxTokens to at most 10",
        id="ceilings",
    ),
    param("S" * 8, 10, 20, None, id="fits"),
    param("S" * 8, None, 20, None, id="uncapped-slots-alone-do-not-trigger"),
    param("S" * 8, 10, None, None, id="unlimited"),
]


@pytest.mark.parametrize(("system", "slot_max", "budget", "expected"), FEASIBILITY)
def test_budget_feasibility_lint(
    system: str, slot_max: int | None, budget: int | None, expected: str | None
) -> None:
    """Before rendering, the lint says when the fixed part of the layout cannot be sure to fit."""
    from storyforge.engine.feasibility import check_budget

    issues = check_budget(compile_template(_layout_doc(system, slot_max)).template, budget)
    if expected is None:
        assert issues == ()
    else:
        assert len(issues) == 1 and issues[0].code == "budget_feasibility"
        assert expected in issues[0].message


def test_no_feasibility_issue_without_a_fixed_part() -> None:
    """A layout with nothing fixed in it (only slots) has nothing the slots could crowd out."""
    from storyforge.engine.feasibility import check_budget

    assert check_budget(compile_template(_walk_doc(True, 50, "{{item.a}}")).template, 10) == ()


def test_feasibility_is_logged_once_before_rendering(caplog: pytest.LogCaptureFixture) -> None:
    """render() logs the feasibility problem of a template and budget once, before its first render."""
    compiled = compile_template(_layout_doc("S" * 8 + "{{name}}", 40))
    with caplog.at_level("WARNING", logger="storyforge.engine"):
        for _ in range(3):
            render(compiled, {"turns": [], "name": "A"}, budget=21)
    lines = [
        r.getMessage()
        for r in caplog.records
        if "budget_feasibility" in r.getMessage() or "fixed part" in r.getMessage()
    ]
    assert len(lines) == 1 and "template 'fit' with a 21-token budget" in lines[0]


_STORY = {
    "story": {"chapters": [{"title": "Dawn"}, {"title": "Dusk"}]},
    "a": {"x.y": "XY", "x": {"y": "nested"}},
}

BRACKETS = [
    param('{{ story["chapters"][0].title }}', "Dawn", id="quoted-then-index-then-dot"),
    param("{{ story['chapters'][1].title }}", "Dusk", id="single-quotes"),
    param('{{ a["x.y"] }}', "XY", id="quoted-key-with-dot"),
    param('{{a["x.y"]}}', "XY", id="no-spaces"),
    param('{{ story["chapters"][0]["title"] }}', "Dawn", id="all-brackets"),
    param('{{ a["x"].y }}', "nested", id="quoted-then-dot"),
    param('{{ a["x.y"] | upper }}', "XY", id="with-a-filter"),
    param("{{ a[x.y] }}", "XY", id="unquoted-bracket-is-verbatim"),
    param("{{ a.x.y }}", "nested", id="dots"),
    param('[{{ a["nope"] }}]', "[]", id="missing-quoted-key"),
]


@pytest.mark.parametrize(("content", "expected"), BRACKETS)
def test_quoted_bracket_segments(content: str, expected: str) -> None:
    """`story["chapters"][0].title` and `a["x.y"]` read the quoted key, with or without a filter."""
    doc = _doc({"plan": []}, [{"kind": "message", "role": "user", "content": content}])
    assert _contents(doc, _STORY, {}) == [expected]


def _walk_doc(stop: bool, slot_max: int | None, content: str) -> dict[str, Any]:
    slot: dict[str, Any] = {
        "priority": 0,
        "plan": [
            {
                "kind": "forEach",
                "source": {"source": "turns"},
                "fillDir": "prepend",
                "stopWhenOutOfBudget": stop,
                "map": [{"kind": "message", "role": "user", "content": content}],
            }
        ],
    }
    if slot_max is not None:
        slot["budget"] = {"maxTokens": slot_max}
    return {
        "id": "walk",
        "name": "walk",
        "task": "x",
        "version": 1,
        "layout": [{"kind": "slot", "name": "s"}],
        "slots": {"s": slot},
    }


def test_history_walk_stops_once_nothing_can_fit() -> None:
    """50,000 turns under a spent budget: the walk stops, the messages are those of a full walk."""
    turns = [{"n": i, "t": f"turn {i} " * 3} for i in range(50_000)]
    registry = SourceRegistry({"turns": lambda c, a: turns})
    content = "[{{item.n}}] {{item.t}}"
    stopped = render(compile_template(_walk_doc(True, None, content)), {}, registry, budget=100)
    full = render(compile_template(_walk_doc(False, None, content)), {}, registry, budget=100)
    assert stopped.messages == full.messages and stopped.messages
    assert stopped.trace.consumed == full.trace.consumed
    assert len(stopped.trace.raw) < 50  # one event for all the turns passed over
    assert len(full.trace.raw) > 50_000
    first, rest = stopped.trace.events[-3:-1]  # then the slot's insertion into the layout
    assert (first.reason, first.loop, first.detail) == ("over_budget", (13,), None)
    assert (rest.reason, rest.loop) == ("over_budget", (14,))
    assert rest.detail == "49986 items from here on too long for what was left, not rendered"


def test_history_walk_stops_when_the_budget_is_used_up() -> None:
    """When less is left than any item could cost, the walk ends at once, with one event saying so."""
    turns = [{"n": i, "t": "abcdefgh" * 2} for i in range(50_000)]  # 4 tokens each: 15 fill the slot
    registry = SourceRegistry({"turns": lambda c, a: turns})
    stopped = render(compile_template(_walk_doc(True, 60, "{{item.t}}")), {}, registry, budget=100)
    assert len(stopped.messages[0]["content"].split("\n")) == 15
    assert [(e.reason, e.loop) for e in stopped.trace.events[-2:-1]] == [("out_of_budget", (15,))]
    assert len(stopped.trace.raw) == 2 + 15 + 1 + 1


_TEXTS = st.one_of(st.text(max_size=40), st.sampled_from(["{{x}}", "{{x}}{{x}}", "", " ", "é" * 9, "😀" * 5]))


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.tuples(_TEXTS, _TEXTS), max_size=25),
    budget=st.one_of(st.none(), st.integers(min_value=0, max_value=80)),
    slot_max=st.one_of(st.none(), st.integers(min_value=1, max_value=60)),
    content=st.sampled_from(
        ["[{{item.a}}] {{item.b}}", "{{item.a}}", "{{item.a}}{{item.b}}{{x}}", "- {{item}}"]
    ),
)
def test_stopping_early_never_changes_the_messages(
    texts: list[tuple[str, str]], budget: int | None, slot_max: int | None, content: str
) -> None:
    """Stopping the walk (or skipping items too long to fit) emits exactly what a full walk emits."""
    items = [{"a": a, "b": b} for a, b in texts]
    registry = SourceRegistry({"turns": lambda c, a: items})
    ctx = {"x": "xyz{{x}}"}
    stopped = render(compile_template(_walk_doc(True, slot_max, content)), ctx, registry, budget=budget)
    full = render(compile_template(_walk_doc(False, slot_max, content)), ctx, registry, budget=budget)
    assert stopped.messages == full.messages
    assert stopped.warnings == full.warnings
    assert stopped.trace.consumed == full.trace.consumed


SURROGATES = [
    param(
        {"layout": [{"kind": "message", "role": "user", "content": "a\ud800b"}]},
        "layout[0].content",
        "contains a lone surrogate (U+D800) at character 2, which is not valid Unicode text; "
        "remove it or write the whole character",
        id="content",
    ),
    param(
        {"slots": {"s": {"priority": 0, "plan": [{"kind": "message", "role": "user", "content": "\udfff"}]}}},
        "slots.s.plan[0].content",
        "contains a lone surrogate (U+DFFF) at character 1, which is not valid Unicode text; "
        "remove it or write the whole character",
        id="plan-content",
    ),
    param(
        {"description": "x" * 10 + "\ud83d"},
        "description",
        "contains a lone surrogate (U+D83D) at character 11, which is not valid Unicode text; "
        "remove it or write the whole character",
        id="high-surrogate-at-the-end",
    ),
]


@pytest.mark.parametrize(("patch", "path", "message"), SURROGATES)
def test_lone_surrogate_is_a_validation_error_with_a_path(
    patch: dict[str, Any], path: str, message: str
) -> None:
    """A lone surrogate in a template string raises TemplateValidationError naming where it is."""
    from storyforge import TemplateValidationError

    doc = {**_doc({"plan": []}, [{"kind": "message", "role": "user", "content": "ok"}]), **patch}
    with pytest.raises(TemplateValidationError) as caught:
        compile_template(doc)
    assert [(str(i.path), i.code, i.message) for i in caught.value.issues] == [(path, "encoding", message)]


def test_surrogate_pair_is_one_character() -> None:
    """A character written as two surrogate halves is joined, not refused; data surrogates still render."""
    doc = _doc({"plan": []}, [{"kind": "message", "role": "user", "content": "\ud83d\ude00 {{x}}"}])
    result = render(compile_template(doc), {"x": "a\ud800"}, budget=10)
    assert result.messages == [{"role": "user", "content": "😀 a\ud800"}]


def test_positions_in_a_long_string_with_many_placeholders() -> None:
    """Line and column of an error after thousands of lines and placeholders are exact."""
    from storyforge import TemplateValidationError

    text = "".join(f"line {{{{x{i}}}}}\n" for i in range(5000)) + "end {{ a and }}"
    doc = _doc({"plan": []}, [{"kind": "message", "role": "user", "content": text}])
    with pytest.raises(TemplateValidationError) as caught:
        compile_template(doc)
    (issue,) = caught.value.issues
    assert (issue.line, issue.column) == (5001, 14)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        param([{"kind": "slot", "name": "s"}, {"kind": "slot", "name": "s"}], "a\nb\na\nb", id="twice"),
        param(
            [
                {"kind": "slot", "name": "s", "footer": {"role": "user", "content": "F"}},
                {"kind": "slot", "name": "s"},
            ],
            "a\nb\nF\na\nb",
            id="footer-on-the-first-only",
        ),
    ],
)
def test_slot_named_twice_in_the_layout_inserts_its_messages_twice(layout: list[Any], expected: str) -> None:
    """Each layout node gets its own copy of the slot's messages (the reference aliases them: a, b, a, b, b)."""
    plan = [
        {"kind": "message", "role": "user", "content": "a"},
        {"kind": "message", "role": "user", "content": "b"},
    ]
    assert _contents(_doc({"plan": plan}, layout), {}, {}) == [expected]
