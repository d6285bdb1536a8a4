"""Value semantics: paths, lookups, scope, reserved sources, text, equality (§5, §6.2, §7)."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytest import param
from strategies import json_values, shallow_json_values

from storyforge.engine import runtime
from storyforge.engine.errors import RenderLimitError
from storyforge.engine.runtime import (
    RESERVED_SOURCES,
    Frame,
    Scope,
    deep_equal,
    format_number,
    is_contentful,
    lookup,
    lookup_scope,
    parse_path,
    resolve_reserved,
    to_json,
    to_text,
    truthy,
)
from storyforge.engine.sources import RESERVED_SOURCES as SOURCES_RESERVED


def test_reserved_sources_are_reexported() -> None:
    """runtime.RESERVED_SOURCES is the same set as storyforge.engine.sources.RESERVED_SOURCES."""
    assert RESERVED_SOURCES is SOURCES_RESERVED
    assert RESERVED_SOURCES == {"$item", "$index", "$parent", "$globals", "$ctx"}


# -- §5.3 path syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        param("a", ("a",), id="single"),
        param("a.b.c", ("a", "b", "c"), id="dotted"),
        param("a..b", ("a", "b"), id="empty-segments-skipped"),
        param(".a", ("a",), id="leading-dot"),
        param("a.", ("a",), id="trailing-dot"),
        param("a[0]", ("a", "0"), id="bracket-index"),
        param("a.[0]", ("a", "0"), id="dot-bracket"),
        param("a.0", ("a", "0"), id="dot-index"),
        param("dims[beam.m]", ("dims", "beam.m"), id="bracket-keeps-dots"),
        param("x.[]", ("x", ""), id="empty-bracket-is-empty-key"),
        param("[0].name", ("0", "name"), id="leading-bracket"),
        param("a[0].[1]", ("a", "0", "1"), id="nested-brackets"),
        param("a[0", ("a[0",), id="unclosed-bracket-is-a-character"),
        param("a[b[c]", ("a", "b[c"), id="bracket-runs-to-first-close"),
        param("a[0]b", ("a", "0", "b"), id="text-after-bracket"),
        param("my key", ("my key",), id="spaces-kept"),
        param("", (), id="empty"),
    ],
)
def test_parse_path(text: str, expected: tuple[str, ...]) -> None:
    """parse_path splits reference paths exactly as §5.3 describes."""
    assert parse_path(text) == expected


# -- §5.4 lookup ----------------------------------------------------------------------------------

_LIST = ["x", "y", "z"]


@pytest.mark.parametrize(
    ("value", "segments", "expected"),
    [
        param({"a": 1}, ("a",), (True, 1), id="mapping-key"),
        param({"a": None}, ("a",), (True, None), id="none-value-is-found"),
        param({"a": 1}, ("b",), (False, None), id="missing-key"),
        param(_LIST, ("0",), (True, "x"), id="index-0"),
        param(_LIST, ("2",), (True, "z"), id="last-index"),
        param(_LIST, ("3",), (False, None), id="out-of-range"),
        param(_LIST, ("length",), (True, 3), id="list-length"),
        param(("p", "q"), ("1",), (True, "q"), id="tuple-index"),
        param(_LIST, ("-1",), (False, None), id="negative-index"),
        param(_LIST, ("01",), (False, None), id="leading-zero"),
        param(_LIST, ("+1",), (False, None), id="plus-sign"),
        param(_LIST, (" 1",), (False, None), id="leading-space"),
        param(_LIST, ("١",), (False, None), id="non-ascii-digit"),
        param("vessel", ("length",), (False, None), id="string-has-no-length"),
        param(5, ("real",), (False, None), id="number-has-no-members"),
        param({"a": {"b": [{"c": 2}]}}, ("a", "b", "0", "c"), (True, 2), id="deep"),
        param({"a": None}, ("a", "b"), (False, None), id="through-none"),
        param({}, ("keys",), (False, None), id="no-dict-methods"),
        param({}, ("__class__",), (False, None), id="no-dunder-attributes"),
        param(MappingProxyType({"a": 1}), ("a",), (True, 1), id="any-mapping"),
        param(OrderedDict(a=1), ("a",), (True, 1), id="ordered-dict"),
        param({"length": 7}, ("length",), (True, 7), id="mapping-length-key"),
        param({0: "int key"}, ("0",), (False, None), id="keys-are-strings"),
        param(object(), ("__dict__",), (False, None), id="objects-have-no-members"),
        param({"a": 1}, (), (True, {"a": 1}), id="no-segments"),
    ],
)
def test_lookup(value: Any, segments: tuple[str, ...], expected: tuple[bool, Any]) -> None:
    """lookup reads own mapping keys and canonical list indices only (§5.4)."""
    assert lookup(value, segments) == expected


class _Attrs:
    name = "secret"


@pytest.mark.parametrize(
    ("ctx", "item", "path", "expected"),
    [
        param({"vessel": "Kite"}, None, "vessel", "Kite", id="top-level-key"),
        param({"vessel": "Kite"}, None, "ctx.vessel", "Kite", id="through-ctx"),
        param({"item": "hidden"}, "current", "item", "current", id="item-shadows-ctx-item"),
        param({"item": "hidden"}, "current", "ctx.item", "hidden", id="ctx-item-reachable"),
        param({"ctx": {"a": 1}, "a": 2}, None, "ctx.a", 1, id="ctx-key-replaces-binding"),
        param({"a": 1}, None, "item", None, id="item-always-bound"),
        param({"a": 1}, None, "", None, id="empty-path-is-none"),
        param({"title": None, "globals": {"title": "X"}}, None, "title", None, id="null-counts-as-found"),
        param({"globals": {"title": "X"}}, None, "title", "X", id="globals-fallback"),
        param(
            {"hull": {}, "globals": {"hull": {"paint": "red"}}},
            None,
            "hull.paint",
            "red",
            id="whole-path-fallback",
        ),
        param({"globals": {"a": 1}}, None, "globals.a", 1, id="globals-directly"),
        param({"globals": None}, None, "x", None, id="globals-none"),
        param({"globals": [5]}, None, "0", 5, id="globals-list"),
        param({"a": 1}, {"b": 2}, "item.b", 2, id="item-path"),
        param({"globals": {"item": {"b": 3}}}, None, "item.b", 3, id="item-path-falls-back"),
        param("not a mapping", None, "length", None, id="non-mapping-ctx"),
        param("not a mapping", None, "ctx", "not a mapping", id="non-mapping-ctx-binding"),
        param({"o": _Attrs()}, None, "o.name", None, id="no-attribute-access"),
    ],
)
def test_lookup_scope(ctx: Any, item: Any, path: str, expected: Any) -> None:
    """lookup_scope resolves against {"ctx": ctx, **ctx, "item": item} with globals fallback."""
    assert lookup_scope(Scope(ctx, item), parse_path(path)) == expected


def test_scope_push_builds_frames_without_mutation() -> None:
    """Scope.push returns a new scope with one more frame and leaves the parent unchanged."""
    root = Scope({"a": 1})
    inner = root.push("x", 0).push("y", 3)
    assert root.frames == () and root.item is None
    assert inner.item == "y" and inner.ctx is root.ctx
    assert inner.frames == (Frame("x", 0), Frame("y", 3))


# -- §6.2 reserved sources --------------------------------------------------------------------------

_LOOP = (
    Scope({"globals": {"g": {"h": 1}}, "k": 2})
    .push({"name": "outer"}, 4)
    .push({"name": "inner", "n": [1]}, 7)
)


@pytest.mark.parametrize(
    ("source", "args", "scope", "expected"),
    [
        param("$item", None, _LOOP, {"name": "inner", "n": [1]}, id="item"),
        param("$item", {"path": "name"}, _LOOP, "inner", id="item-path"),
        param("$item", {"path": "n.length"}, _LOOP, 1, id="item-path-length"),
        param("$item", {"path": "missing"}, _LOOP, None, id="item-path-missing"),
        param("$item", {"path": ""}, _LOOP, {"name": "inner", "n": [1]}, id="empty-path-is-whole"),
        param("$item", {"path": 3}, _LOOP, {"name": "inner", "n": [1]}, id="non-string-path-is-whole"),
        param("$index", None, _LOOP, 7, id="index"),
        param("$index", {"path": "x"}, _LOOP, 7, id="index-ignores-args"),
        param("$parent", None, _LOOP, {"name": "outer"}, id="parent"),
        param("$parent", {"level": 1, "path": "name"}, _LOOP, "outer", id="parent-level-1"),
        param("$parent", {"level": 0}, _LOOP, {"name": "outer"}, id="level-raised-to-1"),
        param("$parent", {"level": -5}, _LOOP, {"name": "outer"}, id="negative-level"),
        param("$parent", {"level": "2"}, _LOOP, {"name": "outer"}, id="non-number-level-is-1"),
        param("$parent", {"level": True}, _LOOP, {"name": "outer"}, id="bool-level-is-1"),
        param("$parent", {"level": 2}, _LOOP, None, id="level-too-far"),
        param("$parent", {"level": 1.5}, _LOOP, None, id="fractional-level"),
        param("$parent", {"level": math.nan}, _LOOP, None, id="nan-level"),
        param("$parent", {"level": -math.inf}, _LOOP, {"name": "outer"}, id="minus-infinity-level"),
        param("$globals", None, _LOOP, {"g": {"h": 1}}, id="globals"),
        param("$globals", {"path": "g.h"}, _LOOP, 1, id="globals-path"),
        param("$globals", None, Scope({"a": 1}), None, id="no-globals-key"),
        param("$ctx", {"path": "k"}, _LOOP, 2, id="ctx-path"),
        param("$ctx", {"path": "h"}, _LOOP, None, id="ctx-path-no-globals-fallback"),
        param("$item", None, Scope({}), None, id="item-outside-loop"),
        param("$index", None, Scope({}), None, id="index-outside-loop"),
        param("$parent", None, Scope({}).push(1, 0), None, id="parent-of-single-loop"),
        param("turns", None, _LOOP, None, id="not-reserved"),
    ],
)
def test_resolve_reserved(source: str, args: Any, scope: Scope, expected: Any) -> None:
    """Reserved DataRefs read loop frames, globals and the context as §6.2 specifies."""
    assert resolve_reserved(source, args, scope) == expected


# -- §5.5 value -> text -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "text"),
    [
        param(2.0, "2", id="integral-float"),
        param(-0.0, "0", id="negative-zero"),
        param(0.1, "0.1", id="decimal"),
        param(-2.5, "-2.5", id="negative"),
        param(1e16, "10000000000000000", id="1e16"),
        param(1e20, "100000000000000000000", id="1e20"),
        param(1.2345678901234567e20, "123456789012345670000", id="shortest-digits-padded"),
        param(1e21, "1e+21", id="1e21"),
        param(1.5e300, "1.5e+300", id="big-exponent"),
        param(0.000001, "0.000001", id="1e-6-plain"),
        param(1e-7, "1e-7", id="1e-7"),
        param(1.25e-7, "1.25e-7", id="small-with-fraction"),
        param(123.456, "123.456", id="mixed"),
        param(math.nan, "NaN", id="nan"),
        param(math.inf, "Infinity", id="infinity"),
        param(-math.inf, "-Infinity", id="minus-infinity"),
        param(5e-324, "5e-324", id="smallest-subnormal"),
        param(1.7976931348623157e308, "1.7976931348623157e+308", id="max-float"),
    ],
)
def test_format_number(number: float, text: str) -> None:
    """Floats print like JavaScript's Number.prototype.toString."""
    assert format_number(number) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_format_number_round_trips(number: float) -> None:
    """The JavaScript form of any finite float parses back to the same float."""
    assert float(format_number(number)) == number


class _Opaque:
    def __str__(self) -> str:  # pragma: no cover - must never be called
        raise AssertionError("str() of a context object was called")


_circular: list[Any] = [1]
_circular.append(_circular)
_circular_map: dict[str, Any] = {"a": 1}
_circular_map["self"] = _circular_map


@pytest.mark.parametrize(
    ("value", "text"),
    [
        param(None, "", id="none"),
        param("", "", id="empty-string"),
        param("plain", "plain", id="string"),
        param(0, "0", id="zero"),
        param(False, "false", id="false"),
        param(True, "true", id="true"),
        param(2**64, "18446744073709551616", id="big-int-exact"),
        param(3.0, "3", id="float"),
        param({"crates": 3.0}, '{"crates":3}', id="mapping-json"),
        param([1, "a", None, True], '[1,"a",null,true]', id="list-json"),
        param(("t", 1), '["t",1]', id="tuple-json"),
        param({"b": 1, "a": 2}, '{"b":1,"a":2}', id="insertion-order"),
        param({"2": "x", "1": "y"}, '{"2":"x","1":"y"}', id="integer-like-keys-not-reordered"),
        param({"é": "ü"}, '{"é":"ü"}', id="non-ascii-unescaped"),
        param({"q": 'say "hi"\n'}, '{"q":"say \\"hi\\"\\n"}', id="escapes"),
        param([math.nan, math.inf], "[null,null]", id="nan-in-json-is-null"),
        param({1: "a", None: "b"}, '{"1":"a","null":"b"}', id="non-string-keys"),
        param([{}, []], "[{},[]]", id="empty-containers"),
        param(_circular, "", id="circular-list"),
        param(_circular_map, "", id="circular-mapping"),
        param({(1, 2): "x"}, "", id="unusable-key"),
        param(_Opaque(), "", id="opaque-object"),
        param([_Opaque()], "[null]", id="opaque-object-in-json"),
        param(MappingProxyType({"a": [1.5]}), '{"a":[1.5]}', id="mapping-proxy"),
    ],
)
def test_to_text(value: Any, text: str) -> None:
    """Values render as §5.5 says: JS numbers, true/false, compact JSON, "" for the unencodable."""
    assert to_text(value) == text


def test_shared_non_circular_values_encode() -> None:
    """The same list appearing twice (not inside itself) is not mistaken for a cycle."""
    shared = [1]
    assert to_json({"a": shared, "b": shared}) == '{"a":[1],"b":[1]}'


@given(json_values())
def test_to_json_matches_json_dumps_for_finite_data(value: Any) -> None:
    """For data without NaN/infinities, to_json agrees with json.dumps up to number formatting."""
    import json

    def has_float(v: Any) -> bool:
        if isinstance(v, float):
            return True
        if isinstance(v, dict):
            return any(has_float(x) for x in v.values())
        if isinstance(v, list):
            return any(has_float(x) for x in v)
        return False

    if isinstance(value, (dict, list)) and not has_float(value):
        assert to_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _ListCopy(list[Any]):
    """A list the encoder's one-call path for plain lists and dicts does not take."""


class _DictCopy(dict[Any, Any]):
    """A dict the encoder's one-call path for plain lists and dicts does not take."""


_SCALARS = st.one_of(st.text(), st.integers(), st.booleans(), st.none())
_PLAIN = st.recursive(
    st.one_of(_SCALARS, st.floats()),  # floats, and nesting past 4 levels, take the general path
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
        st.dictionaries(st.integers(), inner, max_size=2),  # not plain: non-string keys
    ),
    max_leaves=24,
).filter(lambda value: isinstance(value, (list, tuple, dict)))


@given(_PLAIN)
def test_plain_lists_and_records_encode_as_the_general_path(value: Any) -> None:
    """Lists and dicts of strings (lone surrogates too), ints, booleans and None, nested up
    to 4 levels, are written in one call of Python's C encoder: the same text as the general
    encoder, which subclasses of list and dict take."""
    copy = _DictCopy(value) if isinstance(value, dict) else _ListCopy(value)
    assert to_json(value) == to_json(copy)
    assert to_json([value]) == f"[{to_json(copy)}]"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        param(["a\ud800b"], '["a\\ud800b"]', id="lone-high"),
        param({"k": "\udc00"}, '{"k":"\\udc00"}', id="lone-low"),
        param(["\ud83d\ude00", "\u00e9"], '["\ud83d\ude00","\u00e9"]', id="a-pair-and-non-ascii-kept"),
        param(_ListCopy(["\ud800", "\ud83d\ude00"]), '["\\ud800","\ud83d\ude00"]', id="general-path"),
    ],
)
def test_json_escapes_lone_surrogates_only(value: Any, text: str) -> None:
    """As JSON.stringify: a lone surrogate is written as an escape, a pair and other
    non-ASCII text as they are."""
    assert to_json(value) == text


def test_plain_values_too_long_for_the_output_take_the_general_path() -> None:
    """A list whose JSON could pass MAX_OUTPUT_CHARS is left to the general encoder, which
    raises the limit error as it writes."""
    long = "x" * (runtime.MAX_OUTPUT_CHARS // 2)
    with pytest.raises(RenderLimitError, match="MAX_OUTPUT_CHARS"):
        to_json([long, long, long])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        param("", False, id="empty"),
        param(" \t\n\r\v\f", False, id="ascii-whitespace"),
        param("\u00a0\u2028\u3000", False, id="unicode-spaces"),
        param("\ufeff", False, id="bom-is-whitespace-in-js"),
        param("\x1c", True, id="x1c-is-not-js-whitespace"),
        param("\x85", True, id="nel-is-not-js-whitespace"),
        param(" a ", True, id="content"),
    ],
)
def test_contentful_uses_js_trim(text: str, expected: bool) -> None:
    """The contentful flag uses JavaScript trim whitespace, not str.strip()."""
    assert is_contentful(text) is expected


# -- §7 equality and truthiness --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        param(None, None, True, id="none-none"),
        param(None, 0, False, id="none-zero"),
        param(None, "", False, id="none-empty"),
        param("5", 5, False, id="no-string-number-coercion"),
        param(True, 1, False, id="bool-is-not-number"),
        param(False, 0, False, id="false-is-not-zero"),
        param(True, True, True, id="bool-bool"),
        param(2.0, 2, True, id="float-int"),
        param(math.nan, math.nan, False, id="nan-never-equal"),
        param(math.inf, math.inf, True, id="infinity-equal"),
        param("a", "a", True, id="strings"),
        param([True], [1], False, id="nested-bool-vs-number"),
        param([1, 2], [1, 2], True, id="lists"),
        param([1, 2], [2, 1], False, id="list-order-matters"),
        param([1], (1,), True, id="list-tuple"),
        param({"a": 1, "b": 2}, {"b": 2, "a": 1}, True, id="key-order-ignored"),
        param({"a": [1.0]}, {"a": [1]}, True, id="nested-numbers"),
        param({"a": 1}, {"a": 1, "b": None}, False, id="extra-key"),
        param([math.nan], [None], True, id="nan-in-json-is-null"),
        param({}, [], False, id="mapping-vs-list"),
        param([1], "[1]", False, id="list-vs-string"),
        param(_circular, [1, [1]], False, id="circular-is-false"),
        param(_circular, _circular, True, id="circular-identity"),
        param(MappingProxyType({"a": 1}), {"a": 1}, True, id="mapping-types"),
    ],
)
def test_deep_equal(a: Any, b: Any, expected: bool) -> None:
    """deep_equal is structural, key-order-free and never coerces types (§7, decision #4)."""
    assert deep_equal(a, b) is expected
    assert deep_equal(b, a) is expected


@given(shallow_json_values(), shallow_json_values())
def test_deep_equal_is_symmetric(a: Any, b: Any) -> None:
    """deep_equal(a, b) == deep_equal(b, a) for any JSON-like values."""
    assert deep_equal(a, b) == deep_equal(b, a)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        param(None, False, id="none"),
        param(False, False, id="false"),
        param(0, False, id="zero"),
        param(0.0, False, id="zero-float"),
        param(math.nan, False, id="nan"),
        param("", False, id="empty-string"),
        param([], False, id="empty-list"),
        param({}, False, id="empty-mapping"),
        param(" ", True, id="space"),
        param([0], True, id="list"),
        param({"a": None}, True, id="mapping"),
        param(-1, True, id="negative"),
        param(_Opaque(), True, id="object"),
    ],
)
def test_truthy(value: Any, expected: bool) -> None:
    """Truthiness for and/or/not and {{#if}} is Python-like and never calls __bool__."""
    assert truthy(value) is expected


def test_limit_names_are_documented_constants() -> None:
    """The safety limits are named constants with the documented values."""
    assert (runtime.MAX_EXPANSION_DEPTH, runtime.MAX_NESTING, runtime.MAX_RENDER_CHARS) == (5, 32, 1_000_000)
    assert re.search(r"MAX_RENDER_CHARS", runtime.check_output_size.__doc__ or "")
