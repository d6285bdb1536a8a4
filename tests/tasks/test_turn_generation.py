"""The turn_generation task kind: sources, argument rules, registry, sample story."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge.engine.sources import SourceRegistry, arg_problems
from storyforge.tasks.base import get_task_kind
from storyforge.tasks.turn_generation import (
    RULES,
    TASK,
    TURN_RULES,
    sample_context,
    select_characters,
    select_summaries,
    select_turns,
)


def _turn(n: int, chapter: int = 1, kind: str = "character") -> dict[str, Any]:
    return {
        "turnNo": n,
        "chapterNumber": chapter,
        "authorName": "Narrator" if kind == "narrator" else f"C{n}",
        "authorType": kind,
        "content": f"turn {n}",
    }


TURNS = [
    _turn(1, 1),
    _turn(2, 1, "narrator"),
    _turn(3, 1),
    _turn(4, 2),
    _turn(5, 2, "narrator"),
    _turn(6, 2),
]

CHARACTERS = [
    {"id": "a", "name": "Ada", "description": "first"},
    {"id": "b", "name": "Bo", "description": "second"},
    {"id": "c", "name": "Cy", "description": "third"},
]


def _ctx(**extra: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {
        "turns": TURNS,
        "characters": CHARACTERS,
        "actor": CHARACTERS[1],
        "currentIntent": {"kind": "guided_control", "prompt": "Bo opens the door."},
        "chapterSummaries": [
            {"chapterNumber": 2, "summaryText": "two"},
            {"chapterNumber": 1, "summaryText": "one"},
            {"chapterNumber": 3, "summaryText": "three"},
        ],
        "nextTurnNumber": 7,
        "globals": {"storyTitle": "T", "setting": "S", "char": "Bo"},
    }
    ctx.update(extra)
    return ctx


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param({}, [6, 5, 4, 3, 2, 1], id="default-newest-first"),
        pytest.param({"order": "asc"}, [1, 2, 3, 4, 5, 6], id="asc"),
        pytest.param({"limit": 2}, [6, 5], id="limit-keeps-newest"),
        pytest.param({"order": "asc", "limit": 2}, [1, 2], id="asc-limit-keeps-oldest"),
        pytest.param({"limit": 99}, [6, 5, 4, 3, 2, 1], id="limit-above-length"),
        pytest.param({"chapter": 2, "order": "asc"}, [4, 5, 6], id="chapter"),
        pytest.param({"chapter": 9}, [], id="chapter-absent"),
        pytest.param({"authorType": "narrator", "order": "asc"}, [2, 5], id="narrator-only"),
        pytest.param({"start": 1, "end": 3, "order": "asc"}, [2, 3, 4], id="start-end-inclusive"),
        pytest.param({"start": -2, "order": "asc"}, [5, 6], id="negative-start"),
        pytest.param({"end": -5, "order": "asc"}, [1, 2], id="negative-end"),
        pytest.param({"start": 4, "end": 1}, [], id="empty-range"),
        pytest.param({"start": -50, "end": 50, "order": "asc"}, [1, 2, 3, 4, 5, 6], id="range-clamped"),
        pytest.param({"chapter": 1, "start": -1}, [3], id="filter-before-slice"),
    ],
)
def test_select_turns(args: dict[str, Any], expected: list[int]) -> None:
    """Turns are filtered, sliced, ordered and limited in that order."""
    assert [t["turnNo"] for t in select_turns(TURNS, args)] == expected


def test_select_turns_does_not_mutate_input() -> None:
    """Selecting turns leaves the context's list as it was."""
    before = json.dumps(TURNS)
    select_turns(TURNS, {"order": "desc", "limit": 1})
    assert json.dumps(TURNS) == before


@pytest.mark.parametrize(
    ("args", "current", "expected"),
    [
        pytest.param({}, "b", ["a", "b", "c"], id="roster-order"),
        pytest.param({"exclude_current": True}, "b", ["a", "c"], id="exclude-current"),
        pytest.param({"exclude_current": False}, "b", ["a", "b", "c"], id="exclude-current-false"),
        pytest.param({"exclude_current": True}, None, ["a", "b", "c"], id="no-actor"),
        pytest.param({"ids": ["c", "a"]}, None, ["a", "c"], id="ids-keep-roster-order"),
        pytest.param({"order": "desc", "limit": 2}, None, ["c", "b"], id="desc-limit"),
        pytest.param({"ids": []}, None, [], id="empty-ids"),
    ],
)
def test_select_characters(args: dict[str, Any], current: str | None, expected: list[str]) -> None:
    """Characters are filtered by ids and the actor, then ordered and limited."""
    assert [c["id"] for c in select_characters(CHARACTERS, args, current_id=current)] == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param({}, [3, 2, 1], id="newest-first"),
        pytest.param({"order": "asc"}, [1, 2, 3], id="asc"),
        pytest.param({"limit": 1}, [3], id="limit"),
    ],
)
def test_select_summaries(args: dict[str, Any], expected: list[int]) -> None:
    """Summaries sort by chapter number whatever order the context lists them in."""
    summaries = _ctx()["chapterSummaries"]
    assert [s["chapterNumber"] for s in select_summaries(summaries, args)] == expected


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_summaries_without_a_number_come_last(order: str) -> None:
    """A summary missing its chapter number keeps its place after the numbered ones."""
    summaries = [{"chapterNumber": 1}, {"title": "loose"}, {"chapterNumber": 3}]
    result = select_summaries(summaries, {"order": order})
    assert result[-1] == {"title": "loose"}
    assert [s["chapterNumber"] for s in result[:2]] == ([1, 3] if order == "asc" else [3, 1])


def test_task_is_registered_with_its_sources() -> None:
    """Importing the module registers the kind under its name with every published source."""
    assert get_task_kind("turn_generation") is TASK
    assert TASK.allowed_sources == (
        "turns",
        "characters",
        "actor",
        "intent",
        "currentIntent",
        "chapterSummaries",
        "globals",
    )
    specs = {s.name: s for s in TASK.sources}
    assert set(specs["turns"].args) == {"order", "limit", "start", "end", "chapter", "authorType"}
    assert set(specs["characters"].args) == {"order", "limit", "ids", "exclude_current"}
    assert specs["turns"].args["limit"] == "int >= 1"
    assert dict(specs["intent"].args) == {}


def test_registry_covers_exactly_the_allowed_sources() -> None:
    """The registry has one handler per published source and nothing else."""
    registry = TASK.registry(_ctx())
    assert isinstance(registry, SourceRegistry)
    assert set(registry) == set(TASK.allowed_sources)


@pytest.mark.parametrize(
    ("source", "args", "expected"),
    [
        pytest.param("turns", {"limit": 1}, [TURNS[-1]], id="turns"),
        pytest.param(
            "characters", {"exclude_current": True}, [CHARACTERS[0], CHARACTERS[2]], id="characters"
        ),
        pytest.param("actor", None, CHARACTERS[1], id="actor"),
        pytest.param("intent", None, {"kind": "guided_control", "prompt": "Bo opens the door."}, id="intent"),
        pytest.param(
            "currentIntent",
            None,
            {"kind": "guided_control", "prompt": "Bo opens the door."},
            id="currentIntent",
        ),
        pytest.param("globals", None, {"storyTitle": "T", "setting": "S", "char": "Bo"}, id="globals"),
    ],
)
def test_handlers_read_the_context(source: str, args: Any, expected: Any) -> None:
    """Each handler returns its slice of the context it is called with."""
    assert TASK.registry(_ctx())[source](_ctx(), args) == expected


def test_handlers_tolerate_missing_optional_fields() -> None:
    """A context without summaries, intent or turns gives empty lists and None, not errors."""
    ctx = {"characters": CHARACTERS, "actor": CHARACTERS[0], "globals": {}}
    registry = TASK.registry(ctx)
    assert registry["turns"](ctx, None) == []
    assert registry["chapterSummaries"](ctx, {"limit": 2}) == []
    assert registry["intent"](ctx, None) is None


@pytest.mark.parametrize(
    ("source", "args", "message"),
    [
        pytest.param(
            "turns",
            {"limt": 3},
            "source 'turns' has no arg 'limt'. Did you mean 'limit'? "
            "Accepted: order, limit, start, end, chapter, authorType",
            id="misspelt-arg",
        ),
        pytest.param(
            "turns", {"limit": 0}, "arg 'limit' of source 'turns' must be int >= 1, got 0", id="zero"
        ),
        pytest.param(
            "turns", {"limit": True}, "arg 'limit' of source 'turns' must be int >= 1, got true", id="bool"
        ),
        pytest.param(
            "turns",
            {"order": "newest"},
            "arg 'order' of source 'turns' must be 'asc' | 'desc', got \"newest\"",
            id="order",
        ),
        pytest.param(
            "turns",
            [1, 2],
            "args of source 'turns' must be a mapping with keys order, limit, start, end, chapter, authorType, "
            "got [1, 2]",
            id="not-a-mapping",
        ),
        pytest.param(
            "intent", {"x": 1}, "source 'intent' takes no args, got {\"x\": 1}", id="no-args-source"
        ),
        pytest.param(
            "characters",
            {"exclude_current": "yes"},
            "arg 'exclude_current' of source 'characters' must be true | false, got \"yes\"",
            id="bool-arg",
        ),
        pytest.param(
            "characters",
            {"ids": ["a", 2]},
            "arg 'ids' of source 'characters' must be list[str], got [\"a\", 2]",
            id="ids",
        ),
    ],
)
def test_bad_args_raise_in_the_handler(source: str, args: Any, message: str) -> None:
    """A handler given bad args raises ValueError with a message naming the source and arg."""
    handler = TASK.registry(_ctx())[source]
    with pytest.raises(ValueError, match=re.escape(message)):
        handler(_ctx(), args)


def test_arg_problems_lists_every_problem() -> None:
    """All bad args of one DataRef are reported, not just the first."""
    problems = arg_problems("turns", {"limit": -1, "order": 3, "x": 1}, TURN_RULES)
    assert problems == [
        "arg 'limit' of source 'turns' must be int >= 1, got -1",
        "arg 'order' of source 'turns' must be 'asc' | 'desc', got 3",
        "source 'turns' has no arg 'x'. Accepted: order, limit, start, end, chapter, authorType",
    ]


@pytest.mark.parametrize(
    ("source", "args", "expected"),
    [
        pytest.param("turns", {"limit": 5, "order": "asc"}, [], id="good"),
        pytest.param("turns", None, [], id="no-args"),
        pytest.param(
            "turns", {"limit": 0}, ["arg 'limit' of source 'turns' must be int >= 1, got 0"], id="bad-value"
        ),
        pytest.param("turns", {"limt": 0}, [], id="unknown-name-left-to-linter"),
        pytest.param("turns", "five", [], id="non-mapping-left-to-linter"),
        pytest.param("$item", {"path": 3}, [], id="reserved-ignored"),
        pytest.param("nope", {"limit": 0}, [], id="unknown-source-ignored"),
    ],
)
def test_check_args_reports_values_of_declared_args(source: str, args: Any, expected: list[str]) -> None:
    """Lint-time check_args reports bad values only; names belong to the SourceSpec lint."""
    assert TASK.check_args is not None
    assert list(TASK.check_args(source, args)) == expected


def test_handler_rejects_a_context_field_of_the_wrong_type() -> None:
    """A non-list ``turns`` field is an error naming the field (the engine makes it a warning)."""
    ctx = _ctx(turns="oops")
    with pytest.raises(TypeError, match="context field 'turns' must be a list, got str"):
        TASK.registry(ctx)["turns"](ctx, None)


def test_sample_context_is_deterministic_and_consistent() -> None:
    """Same arguments give the same story; chapters, summaries and the actor line up."""
    first = sample_context(turns=200, seed=7)
    assert json.dumps(first) == json.dumps(sample_context(turns=200, seed=7))
    assert json.dumps(first) != json.dumps(sample_context(turns=200, seed=8))
    assert [t["turnNo"] for t in first["turns"]] == list(range(1, 201))
    assert first["turns"][-1]["chapterNumber"] == 5
    assert [s["chapterNumber"] for s in first["chapterSummaries"]] == [1, 2, 3, 4, 5]
    assert first["actor"]["name"] == first["globals"]["char"] == "Mira Vance"
    assert first["nextTurnNumber"] == 201
    assert {t["authorType"] for t in first["turns"]} == {"character", "narrator"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"turns": -1}, "turns must be >= 0, got -1", id="negative"),
        pytest.param({"actor": "zed"}, "actor must be one of mira, tobin, ashe, got 'zed'", id="actor"),
    ],
)
def test_sample_context_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    """Bad generator arguments fail with a message naming the argument."""
    with pytest.raises(ValueError, match=re.escape(message)):
        sample_context(**kwargs)


def test_sample_context_does_not_share_the_roster() -> None:
    """Editing one generated context cannot change the next one."""
    ctx = sample_context(turns=3)
    ctx["characters"][0]["name"] = "changed"
    ctx["actor"]["description"] = "changed"
    again = sample_context(turns=3)
    assert again["characters"][0]["name"] == "Mira Vance"
    assert again["actor"]["description"] != "changed"


_ARG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.sampled_from(["asc", "desc", "character", "narrator"]),
    st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=3),
)
_ARGS = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(
            st.sampled_from(
                ["order", "limit", "start", "end", "chapter", "authorType", "ids", "exclude_current"]
            ),
            st.text(max_size=5),
        ),
        _ARG_VALUES,
        max_size=4,
    ),
    _ARG_VALUES,
)


@settings(max_examples=300, deadline=None)
@given(source=st.sampled_from(["turns", "characters", "chapterSummaries", "actor", "intent"]), args=_ARGS)
def test_handlers_return_data_or_raise_value_error(source: str, args: Any) -> None:
    """For any args a handler either returns data (when no rule is broken) or raises ValueError."""
    rules = RULES[source]
    problems = arg_problems(source, args, rules)
    handler = TASK.registry(_ctx())[source]
    if problems:
        with pytest.raises(ValueError) as info:
            handler(_ctx(), args)
        assert str(info.value) == "; ".join(problems)
    else:
        result = handler(_ctx(), args)
        if rules:
            assert isinstance(result, list)
            assert len(result) <= (args or {}).get("limit", len(result))
    assert TASK.check_args is not None
    lint = list(TASK.check_args(source, args))
    assert all(isinstance(p, str) for p in lint)
    assert set(lint) <= set(problems)  # lint never reports what the handler accepts
