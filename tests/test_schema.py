"""The v1 JSON Schema and plain-data normalisation (reference-semantics.md §2)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from storyforge.engine.schema import MAX_DEPTH, check_schema, normalize, template_schema
from storyforge.errors import TemplatePath


def base() -> dict[str, Any]:
    return {
        "id": "t",
        "name": "T",
        "task": "demo",
        "version": 1,
        "layout": [{"kind": "slot", "name": "s"}],
        "slots": {"s": {"priority": 0, "plan": [{"kind": "message", "role": "user", "content": "hi"}]}},
    }


def edit(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = base()
    fn(doc)
    return doc


def plan(doc: dict[str, Any]) -> list[Any]:
    return doc["slots"]["s"]["plan"]  # type: ignore[no-any-return]


def test_schema_is_valid_draft_2020_12() -> None:
    """The shipped schema is itself a valid Draft 2020-12 schema."""
    Draft202012Validator.check_schema(template_schema())
    assert template_schema()["$schema"].endswith("2020-12/schema")


VALID: list[Any] = [
    pytest.param(base(), id="minimal"),
    pytest.param(edit(lambda d: d.update(description="x", responseFormat="text")), id="unknown-top-key"),
    pytest.param(
        edit(lambda d: d["layout"].append({"kind": "message", "role": "system", "budget": {"x": 1}})),
        id="layout-message-without-content-and-stray-budget",
    ),
    pytest.param(
        edit(lambda d: d["layout"].append({"kind": "slot", "name": "s", "when": "ignored"})),
        id="layout-slot-stray-when",
    ),
    pytest.param(
        edit(lambda d: d["layout"][0].update(header={"role": "user", "content": "h"})),
        id="single-header-block",
    ),
    pytest.param(
        edit(lambda d: d["layout"][0].update(footer=[{"role": "user", "from": {"source": "x"}}])),
        id="footer-list",
    ),
    pytest.param(edit(lambda d: d["slots"]["s"].update(budget={})), id="empty-budget"),
    pytest.param(edit(lambda d: d["slots"]["s"].update(meta={"a": 1})), id="meta-mapping"),
    pytest.param(edit(lambda d: d["slots"]["s"].update(when="len(turns) > 2")), id="string-condition"),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(when={"type": "eq", "ref": {"source": "x"}})),
        id="eq-without-value",
    ),
    pytest.param(edit(lambda d: d["slots"]["s"].update(priority=0)), id="priority-zero"),
    pytest.param(
        edit(
            lambda d: plan(d).append(
                {
                    "kind": "forEach",
                    "source": {"source": "xs", "args": [1, {"a": None}]},
                    "map": [],
                    "order": "desc",
                    "fillDir": "prepend",
                    "limit": 3,
                    "interleave": {"kind": "separator"},
                    "budget": {"maxTokens": 5},
                    "stopWhenOutOfBudget": False,
                }
            )
        ),
        id="full-forEach",
    ),
    pytest.param(
        edit(
            lambda d: plan(d).append(
                {"kind": "if", "when": {"type": "exists", "ref": {"source": "x"}}, "then": [], "else": []}
            )
        ),
        id="if-else",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "message", "role": "assistant", "prefix": True})),
        id="assistant-prefix",
    ),
    pytest.param(edit(lambda d: d["slots"]["s"].update(priority=2.0)), id="integral-float-priority"),
]


@pytest.mark.parametrize("doc", VALID)
def test_valid_documents_have_no_issues(doc: dict[str, Any]) -> None:
    """Documents the reference accepts give no schema issues (unknown keys are ignored)."""
    assert check_schema(doc) == []


INVALID: list[Any] = [
    pytest.param(edit(lambda d: d.pop("id")), "", "missing required key 'id'", id="missing-id"),
    pytest.param(edit(lambda d: d.update(version=2)), "version", "version 1", id="version-2"),
    pytest.param(edit(lambda d: d.update(version=True)), "version", "found true", id="version-true"),
    pytest.param(edit(lambda d: d.update(version="1")), "version", "version 1", id="version-string"),
    pytest.param(
        edit(lambda d: d.update(slots=[])), "slots", "expected a mapping, found a list", id="slots-array"
    ),
    pytest.param(edit(lambda d: d.update(layout={})), "layout", "expected a list", id="layout-mapping"),
    pytest.param(
        edit(lambda d: d["layout"].append({"kind": "loop"})),
        "layout[1].kind",
        "expected one of 'message', 'slot'",
        id="layout-kind",
    ),
    pytest.param(
        edit(lambda d: d["layout"].append({"kind": "message", "role": "usr"})),
        "layout[1].role",
        "Did you mean 'user'?",
        id="role-typo",
    ),
    pytest.param(
        edit(lambda d: d["layout"].append({"kind": "slot"})),
        "layout[1]",
        "missing required key 'name'",
        id="layout-slot-without-name",
    ),
    pytest.param(
        edit(lambda d: d["layout"][0].update(header="Intro")),
        "layout[0].header",
        "message block",
        id="header-string",
    ),
    pytest.param(
        edit(lambda d: d["layout"][0].update(omitIfEmpty="no")),
        "layout[0].omitIfEmpty",
        "expected true or false",
        id="omitIfEmpty-string",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(priority=-1)),
        "slots.s.priority",
        "expected an integer >= 0",
        id="priority-negative",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(priority=1.5)),
        "slots.s.priority",
        "expected an integer, found 1.5",
        id="priority-fraction",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(priority=True)),
        "slots.s.priority",
        "found true",
        id="priority-bool",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(budget={"maxTokens": 0})),
        "slots.s.budget.maxTokens",
        ">= 1",
        id="maxTokens-zero",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(budget={"maxTokens": 2.5})),
        "slots.s.budget.maxTokens",
        "expected an integer",
        id="maxTokens-fraction",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(budget={"maxTokens": False})),
        "slots.s.budget.maxTokens",
        "found false",
        id="maxTokens-bool",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(meta=[1])), "slots.s.meta", "expected a mapping", id="meta-list"
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].pop("plan")),
        "slots.s",
        "missing required key 'plan'",
        id="slot-without-plan",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(when=5)),
        "slots.s.when",
        "expected a condition",
        id="when-number",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(when={"type": "contains", "ref": {"source": "x"}})),
        "slots.s.when.type",
        "expected one of",
        id="condition-type",
    ),
    pytest.param(
        edit(lambda d: d["slots"]["s"].update(when={"type": "exists"})),
        "slots.s.when",
        "missing required key 'ref'",
        id="condition-without-ref",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "message", "role": "user", "content": 3})),
        "slots.s.plan[1].content",
        "expected a string, found 3",
        id="content-number",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "message", "role": "user", "from": "turns"})),
        "slots.s.plan[1].from",
        "expected a mapping",
        id="from-string",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "message", "role": "user", "from": {"args": 1}})),
        "slots.s.plan[1].from",
        "missing required key 'source'",
        id="dataref-without-source",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "forEach", "map": []})),
        "slots.s.plan[1]",
        "missing required key 'source'",
        id="forEach-without-source",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "forEach", "source": {"source": "x"}, "map": [], "limit": 0})),
        "slots.s.plan[1].limit",
        ">= 1",
        id="limit-zero",
    ),
    pytest.param(
        edit(
            lambda d: plan(d).append({"kind": "forEach", "source": {"source": "x"}, "map": [], "order": "up"})
        ),
        "slots.s.plan[1].order",
        "expected one of 'asc', 'desc'",
        id="order-enum",
    ),
    pytest.param(
        edit(
            lambda d: plan(d).append(
                {"kind": "forEach", "source": {"source": "x"}, "map": [], "fillDir": "front"}
            )
        ),
        "slots.s.plan[1].fillDir",
        "expected one of",
        id="fillDir-enum",
    ),
    pytest.param(
        edit(
            lambda d: plan(d).append(
                {"kind": "forEach", "source": {"source": "x"}, "map": [], "interleave": {"kind": "sep"}}
            )
        ),
        "slots.s.plan[1].interleave.kind",
        '"separator"',
        id="interleave-kind",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "if", "then": []})),
        "slots.s.plan[1]",
        "missing required key 'when'",
        id="if-without-when",
    ),
    pytest.param(
        edit(lambda d: plan(d).append({"kind": "loop"})),
        "slots.s.plan[1].kind",
        "expected one of 'message', 'forEach', 'if'",
        id="plan-kind",
    ),
    pytest.param(
        edit(
            lambda d: plan(d).append(
                {
                    "kind": "if",
                    "when": "x",
                    "then": [
                        {
                            "kind": "forEach",
                            "source": {"source": "x"},
                            "map": [{"kind": "message", "role": "bot"}],
                        }
                    ],
                }
            )
        ),
        "slots.s.plan[1].then[0].map[0].role",
        "expected one of",
        id="deep-role",
    ),
]


@pytest.mark.parametrize(("doc", "path", "fragment"), INVALID)
def test_invalid_documents_name_path_and_problem(doc: dict[str, Any], path: str, fragment: str) -> None:
    """Each violation is reported at its path with a sentence naming what was expected."""
    issues = check_schema(doc)
    matching = [i for i in issues if str(i.path) == (path or "<template>")]
    assert matching, f"no issue at {path!r}: {[str(i) for i in issues]}"
    assert any(fragment in i.message for i in matching), [i.message for i in matching]
    assert all(i.code == "schema" for i in issues)


def test_all_schema_violations_reported_in_one_pass() -> None:
    """Every violation in the document is listed, not just the first."""
    doc = base()
    doc["version"] = 3
    doc["layout"].append({"kind": "message", "role": "bot"})
    doc["slots"]["s"]["priority"] = -2
    paths = {str(i.path) for i in check_schema(doc)}
    assert {"version", "layout[1].role", "slots.s.priority"} <= paths


# -- normalisation -----------------------------------------------------------------------------


def test_normalize_deep_copies_into_plain_data() -> None:
    """Mappings become dicts, sequences lists; nothing is shared with the input."""
    inner = {"k": [1, 2]}
    source = MappingProxyType({"a": inner, "b": (3, {"c": None})})
    out, issues = normalize(source)
    assert issues == []
    assert out == {"a": {"k": [1, 2]}, "b": [3, {"c": None}]}
    assert type(out) is dict and type(out["b"]) is list
    assert out["a"] is not inner and out["a"]["k"] is not inner["k"]


def test_normalize_keeps_key_order() -> None:
    """The author's key order survives (slot ties are broken by declaration order)."""
    out, _ = normalize({"z": 1, "a": 2, "m": {"y": 1, "b": 2}})
    assert list(out) == ["z", "a", "m"] and list(out["m"]) == ["y", "b"]


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        pytest.param({"a": {1: "x"}}, "a", "mapping keys must be strings", id="int-key"),
        pytest.param({"a": [{1, 2}]}, "a[0]", "found a set", id="set"),
        pytest.param({"a": object()}, "a", "found a object", id="object"),
        pytest.param({"a": b"x"}, "a", "found a bytes", id="bytes"),
    ],
)
def test_normalize_reports_non_json_data(value: Any, path: str, fragment: str) -> None:
    """Values no JSON document can hold are reported at their path."""
    _, issues = normalize(value)
    assert [str(i.path) for i in issues] == [path]
    assert fragment in issues[0].message


def test_normalize_reports_cycles() -> None:
    """A structure that contains itself is reported instead of recursing forever."""
    doc: dict[str, Any] = {"a": []}
    doc["a"].append(doc)
    _, issues = normalize(doc)
    assert [str(i.path) for i in issues] == ["a[0]"]
    assert "cycle" in issues[0].message


def test_normalize_limits_depth_without_recursion() -> None:
    """Nesting past MAX_DEPTH is one issue, even thousands of levels deep."""
    deep: list[Any] = []
    cur = deep
    for _ in range(5000):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    _, issues = normalize({"x": deep})
    assert len(issues) == 1 and issues[0].code == "too_deep"
    assert len(issues[0].path) == MAX_DEPTH


def test_schema_issue_paths_are_template_paths() -> None:
    """Issue paths are TemplatePath values that print as dotted/bracketed paths."""
    doc = copy.deepcopy(base())
    doc["slots"]["my slot"] = {"priority": "high", "plan": []}
    issue = next(i for i in check_schema(doc) if "priority" in str(i.path))
    assert isinstance(issue.path, TemplatePath)
    assert str(issue.path) == 'slots["my slot"].priority'


# -- the compiled validator agrees with jsonschema -------------------------------------------------
