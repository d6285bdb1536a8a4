"""Conditions: structured truth tables (§7), string expressions, one shared AST, and safety."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from textwrap import dedent
from typing import Any

import pytest
from hypothesis import given, settings
from pytest import param
from strategies import condition_texts

from storyforge.engine.nodes import Call, Compare, Condition, FrozenDict, Literal, Path, Ref
from storyforge.engine.parser import compile_condition, parse_expression
from storyforge.engine.runtime import Scope
from storyforge.engine.sources import MISSING
from storyforge.errors import TemplatePath, TemplateValidationError

_circular: list[Any] = [1]
_circular.append(_circular)


class _Opaque:
    pass


def evaluate(spec: Any, value: Any, scope: Scope | None = None) -> bool:
    """Evaluate ``spec`` with every DataRef resolving to ``value``."""
    condition = compile_condition(spec)
    return condition.evaluate(scope or Scope({}), lambda source, args: value)


def structured(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "ref": {"source": "x"}, **extra}


# -- §7 structured truth tables -----------------------------------------------------------------------

EXISTS = [
    param(None, False, id="none"),
    param(0, True, id="zero"),
    param("", True, id="empty-string"),
    param(False, True, id="false"),
    param([], True, id="empty-list"),
    param({}, True, id="empty-mapping"),
    param(math.nan, True, id="nan"),
]


@pytest.mark.parametrize(("value", "expected"), EXISTS)
def test_exists(value: Any, expected: bool) -> None:
    """exists is true for every value except None."""
    assert evaluate(structured("exists"), value) is expected


NON_EMPTY = [
    param(None, False, id="none"),
    param("", False, id="empty-string"),
    param(" ", True, id="whitespace-string-counts"),
    param("x", True, id="string"),
    param([], False, id="empty-list"),
    param([None], True, id="list"),
    param(("t",), True, id="tuple"),
    param({}, False, id="empty-mapping"),
    param({"a": 1}, False, id="mapping-always-false"),
    param(5, False, id="number-always-false"),
    param(True, False, id="bool"),
]


@pytest.mark.parametrize(("value", "expected"), NON_EMPTY)
def test_non_empty(value: Any, expected: bool) -> None:
    """nonEmpty is true only for a non-empty list or string (mappings are never non-empty)."""
    assert evaluate(structured("nonEmpty"), value) is expected


EQ = [
    param(None, None, True, id="none-none"),
    param(None, 0, False, id="none-zero"),
    param(0, None, False, id="zero-none"),
    param("5", 5, False, id="string-vs-number"),
    param(5, "5", False, id="number-vs-string"),
    param(True, 1, False, id="bool-vs-one"),
    param(1, True, False, id="one-vs-bool"),
    param(False, 0, False, id="false-vs-zero"),
    param(2.0, 2, True, id="float-vs-int"),
    param(math.nan, math.nan, False, id="nan"),
    param(math.inf, math.inf, True, id="infinity"),
    param(-math.inf, math.inf, False, id="minus-infinity"),
    param("a", "a", True, id="string"),
    param([True], [1], False, id="nested-bool"),
    param({"a": 1, "b": 2}, {"b": 2, "a": 1}, True, id="key-order-ignored"),
    param({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2}]}, True, id="deep-structures"),
    param([1, 2], [2, 1], False, id="list-order"),
    param(_circular, [1, [1]], False, id="circular-gives-false"),
    param(_Opaque(), {}, False, id="unknown-type"),
]


@pytest.mark.parametrize(("ref_value", "value", "expected"), EQ)
def test_eq_and_neq(ref_value: Any, value: Any, expected: bool) -> None:
    """eq is structural equality without coercion; neq is its negation."""
    assert evaluate(structured("eq", value=value), ref_value) is expected
    assert evaluate(structured("neq", value=value), ref_value) is (not expected)


ORDER = [
    param(3, 2, True, False, id="numbers"),
    param(2, 2, False, False, id="equal"),
    param(2.5, 3, False, True, id="float-int"),
    param(math.inf, 1e308, True, False, id="infinity-compares"),
    param(-math.inf, 0, False, True, id="minus-infinity"),
    param(math.nan, 1, False, False, id="nan-never"),
    param(1, math.nan, False, False, id="nan-value-never"),
    param("b", "a", False, False, id="strings-never"),
    param("3", 2, False, False, id="numeric-string-never"),
    param(True, 0, False, False, id="bool-never"),
    param(1, False, False, False, id="bool-value-never"),
    param(None, 0, False, False, id="none-never"),
    param([3], 2, False, False, id="list-never"),
]


@pytest.mark.parametrize(("ref_value", "value", "gt", "lt"), ORDER)
def test_gt_and_lt(ref_value: Any, value: Any, gt: bool, lt: bool) -> None:
    """gt/lt hold only when both sides are real numbers (no NaN, no booleans)."""
    assert evaluate(structured("gt", value=value), ref_value) is gt
    assert evaluate(structured("lt", value=value), ref_value) is lt


@pytest.mark.parametrize(
    ("kind", "ref_value", "expected"),
    [
        param("eq", None, False, id="eq-null-is-not-missing"),
        param("eq", MISSING, True, id="eq-missing-missing"),
        param("eq", 0, False, id="eq-zero"),
        param("neq", None, True, id="neq-null-is-not-missing"),
        param("neq", MISSING, False, id="neq-missing-missing"),
        param("gt", 1, False, id="gt"),
        param("lt", 1, False, id="lt"),
    ],
)
def test_missing_value_is_undefined(kind: str, ref_value: Any, expected: bool) -> None:
    """A structured comparison without "value" compares against a missing value, not null (#19, #20)."""
    assert evaluate(structured(kind), ref_value) is expected


def test_failed_resolution_is_absent() -> None:
    """A DataRef the renderer could not resolve (None) makes exists false and nonEmpty false."""
    assert evaluate(structured("exists"), None) is False
    assert evaluate(structured("nonEmpty"), None) is False
    assert evaluate(structured("eq", value=None), None) is True
    assert evaluate(structured("exists"), MISSING) is False
    assert evaluate(structured("eq", value=None), MISSING) is False
    assert evaluate(structured("neq", value=None), MISSING) is True


def test_structured_condition_calls_resolve_once_with_its_args() -> None:
    """Evaluation calls resolve exactly once, with the source name and the DataRef's args."""
    calls: list[tuple[str, Any]] = []
    condition = compile_condition(
        {"type": "gt", "ref": {"source": "turns", "args": {"last": [1, 2]}}, "value": 1}
    )

    def resolve(source: str, args: Any) -> Any:
        calls.append((source, args))
        return 5

    assert condition.evaluate(Scope({}), resolve) is True
    assert condition.evaluate(Scope({}), resolve) is True
    assert calls == [("turns", {"last": (1, 2)}), ("turns", {"last": (1, 2)})]


def test_refs_lists_data_refs() -> None:
    """refs() gives the (source, args) of every DataRef a condition reads."""
    structured_condition = compile_condition(
        {"type": "exists", "ref": {"source": "intent", "args": {"k": 1}}}
    )
    assert structured_condition.refs() == (("intent", {"k": 1}),)
    text = compile_condition('exists(source("a")) and len(source("b", {"n": [1]})) > 0 and x')
    assert text.refs() == (("a", None), ("b", {"n": (1,)}))
    assert compile_condition("x > 1").refs() == ()


def test_structured_and_string_conditions_share_one_ast() -> None:
    """A structured condition and its string spelling compile to equal ASTs."""
    pairs = [
        ({"type": "exists", "ref": {"source": "a"}}, 'exists(source("a"))'),
        ({"type": "nonEmpty", "ref": {"source": "a", "args": {"n": 2}}}, 'nonEmpty(source("a", {"n": 2}))'),
        ({"type": "eq", "ref": {"source": "a"}, "value": "x"}, 'source("a") == "x"'),
        ({"type": "neq", "ref": {"source": "a"}, "value": [1, True]}, 'source("a") != [1, true]'),
        ({"type": "gt", "ref": {"source": "a"}, "value": 2}, 'source("a") > 2'),
        ({"type": "lt", "ref": {"source": "a"}, "value": None}, 'source("a") < null'),
    ]
    for spec, text in pairs[:2] + pairs[4:]:
        assert compile_condition(spec).expr == compile_condition(text).expr, text
    # list literals parse to ListExpr; the structured value is a frozen constant
    assert compile_condition(pairs[2][0]).expr == Compare(
        op="==", left=Ref(source="a"), right=Literal(value="x")
    )
    assert compile_condition(pairs[3][0]).expr == Compare(
        op="!=", left=Ref(source="a"), right=Literal(value=(1, True))
    )
    assert compile_condition(pairs[0][0]).expr == Call(name="exists", args=(Ref(source="a"),))


def test_constants_of_different_types_never_share_a_compiled_condition() -> None:
    """`value: true`, `value: 1` and `value: 1.0` compile to distinct, unequal conditions."""
    specs = [structured("eq", value=v) for v in (True, 1, 1.0, "1")]
    conditions = [compile_condition(spec) for spec in specs]
    assert [c.evaluate(Scope({}), lambda s, a: 1) for c in conditions] == [False, True, True, False]
    assert len({c.expr for c in conditions}) == 4
    assert Literal(value=True) != Literal(value=1) and Literal(value=(1,)) != Literal(value=(True,))


def test_compiling_deep_copies_the_spec() -> None:
    """Later edits to the caller's spec never reach the compiled condition (decision #5)."""
    spec: dict[str, Any] = {"type": "eq", "ref": {"source": "x", "args": {"k": [1]}}, "value": {"a": [1]}}
    condition = compile_condition(spec)
    snapshot = copy.deepcopy(spec)
    spec["value"]["a"].append(2)
    spec["ref"]["args"]["k"].append(3)
    spec["type"] = "neq"
    assert condition.evaluate(Scope({}), lambda s, a: {"a": [1]}) is True
    assert condition.refs() == (("x", {"k": (1,)}),)
    assert snapshot["ref"]["args"] == {"k": [1]}


def test_conditions_are_immutable_hashable_and_picklable() -> None:
    """Compiled conditions are frozen, hashable, and their frozen values reject mutation."""
    condition = compile_condition(
        {"type": "eq", "ref": {"source": "x", "args": {"a": 1}}, "value": {"b": [2]}}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        condition.source = "x"  # type: ignore[misc]
    assert hash(condition) == hash(
        compile_condition({"type": "eq", "ref": {"source": "x", "args": {"a": 1}}, "value": {"b": [2]}})
    )
    args = condition.refs()[0][1]
    assert isinstance(args, FrozenDict) and isinstance(args, dict)
    with pytest.raises(TypeError):
        args["a"] = 2
    assert pickle.loads(pickle.dumps(args)) == {"a": 1}
    assert copy.deepcopy(args) == args


# -- string conditions --------------------------------------------------------------------------------

_CTX = {
    "turns": [{"speaker": "ann"}, {"speaker": "bob"}, {"speaker": "ann"}],
    "model": "llama3",
    "tags": ["fantasy", "short"],
    "count": 0,
    "name": "",
    "globals": {"mode": "chat"},
    "settings": {"temperature": 0.7},
}

STRING_CASES = [
    param("len(turns) > 2 and ctx.model == 'llama3'", True, id="brief-example"),
    param("len(turns) > 3", False, id="len-gt"),
    param("len(turns) >= 3 and len(turns) <= 3", True, id="ge-le"),
    param("model != 'qwen'", True, id="neq"),
    param("'fantasy' in tags", True, id="in-list"),
    param("'horror' not in tags", True, id="not-in"),
    param("'ll' in model", True, id="substring"),
    param("'temperature' in settings", True, id="mapping-key"),
    param("not name", True, id="not-empty-string"),
    param("count", False, id="zero-is-falsy"),
    param("missing", False, id="missing-is-falsy"),
    param("missing == null", True, id="missing-equals-null"),
    param("exists(missing)", False, id="exists-missing"),
    param("exists(count)", True, id="exists-zero"),
    param("nonEmpty(tags) and not nonEmpty(settings)", True, id="non-empty-mapping-false"),
    param("mode == 'chat'", True, id="globals-fallback"),
    param("(count > 1 or model == 'llama3') and not (name)", True, id="parentheses"),
    param("true and not false and null == null", True, id="literals"),
    param("turns[1].speaker == 'bob'", True, id="bracket-path"),
    param("turns.length == 3", True, id="length-path"),
    param("settings.temperature > 0.5", True, id="float"),
    param("'1' == 1", False, id="no-coercion"),
    param("true == 1", False, id="bool-vs-number"),
    param("true > 0", False, id="bool-not-ordered"),
    param("'b' > 'a'", False, id="strings-not-ordered"),
    param("tags == ['fantasy', 'short']", True, id="list-equality"),
    param("len(turns) - 1 == 2", True, id="arithmetic"),
    param("-count == 0", True, id="negation"),
    param("(tags | length) == 2", True, id="parenthesised-filter"),
    param("(model | upper) == 'LLAMA3'", True, id="filter-then-compare"),
    param("$ctx.model == 'llama3' and $globals.mode == 'chat'", True, id="reserved-ctx-globals"),
    param("$item == null and $index == null and $parent == null", True, id="reserved-outside-loops"),
    param('"fantasy" in tags and \'x\' != "y"', True, id="quote-styles"),
    param("count == 0.0", True, id="int-float"),
]


@pytest.mark.parametrize(("text", "expected"), STRING_CASES)
def test_string_conditions(text: str, expected: bool) -> None:
    """String conditions evaluate with leaf path rules and the §7 comparison semantics."""
    assert compile_condition(text).evaluate(Scope(_CTX), lambda s, a: None) is expected


def test_string_conditions_read_loop_frames() -> None:
    """$item, $index and $parent in a string condition read the current loop frames."""
    scope = Scope(_CTX).push({"id": "outer"}, 0).push({"speaker": "ann"}, 2)
    condition = compile_condition(
        "$index == 2 and $item.speaker == 'ann' and item.speaker == 'ann' and $parent.id == 'outer'"
    )
    assert condition.evaluate(scope, lambda s, a: None) is True


def test_string_condition_source_calls_resolve() -> None:
    """source("name", args) in a string condition goes through resolve once per evaluation."""
    calls: list[tuple[str, Any]] = []

    def resolve(source: str, args: Any) -> Any:
        calls.append((source, args))
        return ["a", "b"]

    condition = compile_condition('len(source("turns", {"last": 2})) == 2')
    assert condition.evaluate(Scope({}), resolve) is True
    assert calls == [("turns", {"last": 2})]


def test_short_circuit_skips_later_sources() -> None:
    """`and`/`or` stop at the deciding operand, so later DataRefs are not resolved."""
    calls: list[str] = []

    def resolve(source: str, args: Any) -> Any:
        calls.append(source)
        return None

    compile_condition('exists(source("a")) and exists(source("b"))').evaluate(Scope({}), resolve)
    assert calls == ["a"]


def test_string_condition_keeps_its_source_text() -> None:
    """A compiled string condition keeps the original text for traces."""
    assert compile_condition("x > 1").source == "x > 1"


# -- errors ---------------------------------------------------------------------------------------------

CONDITION_ERRORS = [
    param(
        "len(turns) > 2 and",
        """\
        1 problem
          slots.s.when, line 1, column 19: expected an expression after 'and', got the end of the condition
              | len(turns) > 2 and
              |                   ^""",
        id="dangling-and",
    ),
    param(
        "a < b < c",
        """\
        1 problem
          slots.s.when, line 1, column 7: expected an operator, '|' or the end of the condition after 'b', got '<'; comparisons cannot be chained, combine them with 'and'
              | a < b < c
              |       ^""",
        id="chained-comparison",
    ),
    param(
        "tags | length == 2",
        """\
        1 problem
          slots.s.when, line 1, column 15: expected '(', '|' or the end of the condition after 'length', got '=='; filters apply to everything on their left, so compare a filtered value in parentheses: (x | length) > 2
              | tags | length == 2
              |               ^""",
        id="comparison-after-filter",
    ),
    param(
        "x = 1",
        """\
        1 problem
          slots.s.when, line 1, column 3: expected an operator, '(', '|' or the end of the condition after 'x', got '='; use '==' to compare
              | x = 1
              |   ^""",
        id="single-equals",
    ),
    param(
        "source(name)",
        """\
        1 problem
          slots.s.when, line 1, column 1: source() needs the source name as a string literal, e.g. source("turns")
              | source(name)
              | ^""",
        id="source-needs-literal",
    ),
    param(
        "len(a, b)",
        """\
        1 problem
          slots.s.when, line 1, column 1: len() takes 1 argument, got 2
              | len(a, b)
              | ^""",
        id="arity",
    ),
    param(
        "",
        """\
        1 problem
          slots.s.when, line 1, column 1: expected an expression, got the end of the condition
              | 
              | ^""",
        id="empty",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CONDITION_ERRORS)
def test_string_condition_errors(text: str, expected: str) -> None:
    """String condition syntax errors read like sentences and point into the string."""
    with pytest.raises(TemplateValidationError) as caught:
        compile_condition(text, TemplatePath(("slots", "s", "when")))
    assert str(caught.value) == dedent(expected)


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        param(
            {"type": "nonempty", "ref": {"source": "x"}},
            "slots.s.when.type",
            "unknown condition type 'nonempty'. Did you mean 'nonEmpty'? Expected one of 'exists', 'nonEmpty', 'eq', 'neq', 'gt', 'lt'",
            id="unknown-type",
        ),
        param(
            {"ref": {"source": "x"}},
            "slots.s.when.type",
            "unknown condition type nothing. Expected one of 'exists', 'nonEmpty', 'eq', 'neq', 'gt', 'lt'",
            id="missing-type",
        ),
        param(
            {"type": "exists"},
            "slots.s.when.ref",
            'a condition needs "ref": {"source": "<name>", "args"?: …}',
            id="missing-ref",
        ),
        param(
            {"type": "exists", "ref": {"source": 3}},
            "slots.s.when.ref.source",
            'a DataRef needs a string "source"',
            id="source-not-a-string",
        ),
    ],
)
def test_structured_condition_errors(spec: dict[str, Any], path: str, message: str) -> None:
    """A malformed structured condition names the offending key and what is expected."""
    with pytest.raises(TemplateValidationError) as caught:
        compile_condition(spec, TemplatePath(("slots", "s", "when")))
    assert [(str(i.path), i.message) for i in caught.value.issues] == [(path, message)]


def test_condition_of_wrong_type_is_a_validation_error() -> None:
    """A condition that is neither a mapping nor a string raises TemplateValidationError."""
    with pytest.raises(TemplateValidationError, match="got int"):
        compile_condition(3)  # type: ignore[arg-type]


def test_unknown_keys_are_ignored() -> None:
    """Extra keys in a structured condition are dropped, as in the reference."""
    assert evaluate({"type": "exists", "ref": {"source": "x", "extra": 1}, "note": "hi"}, 1) is True


def test_parse_expression_builds_plain_nodes() -> None:
    """parse_expression returns the AST (spans excluded from equality)."""
    assert parse_expression("a.b > 1") == Compare(
        op=">", left=Path(segments=("a", "b")), right=Literal(value=1)
    )


@settings(max_examples=400)
@given(condition_texts())
def test_any_condition_string_compiles_or_raises_validation_error(text: str) -> None:
    """Every condition string either compiles (and evaluates to a bool) or raises TemplateValidationError."""
    try:
        condition = compile_condition(text)
    except TemplateValidationError as error:
        assert error.issues and all(i.line is not None for i in error.issues)
    else:
        assert isinstance(condition, Condition)
        assert condition.evaluate(Scope(_CTX).push("x", 0), lambda s, a: [1]) in (True, False)


@pytest.mark.parametrize(
    "text", ["(" * 10_000, "(" * 10_000 + "x" + ")" * 10_000, "not " * 5_000 + "x", "-" * 10_000 + "1"]
)
def test_deep_condition_input_never_recurses(text: str) -> None:
    """Deeply nested condition strings compile or raise TemplateValidationError, never RecursionError."""
    try:
        compile_condition(text)
    except TemplateValidationError:
        pass
