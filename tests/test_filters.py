"""Filters: each maps values as documented, is total, and respects the output limits."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytest import param
from strategies import shallow_json_values

from storyforge.engine import filters
from storyforge.engine.runtime import to_text


def _filter(name: str, value: Any, *args: Any) -> Any:
    return filters.FILTERS[name].fn(value, *args)


@pytest.mark.parametrize(
    ("name", "value", "args", "expected"),
    [
        param("default", None, ("n/a",), "n/a", id="default-none"),
        param("default", "", ("n/a",), "", id="default-keeps-empty"),
        param("default", "", ("n/a", True), "n/a", id="default-falsy"),
        param("default", 0, ("n/a",), 0, id="default-keeps-zero"),
        param("join", ["a", 1, None], (", ",), "a, 1, ", id="join"),
        param("join", ["a", "b"], (), "ab", id="join-no-separator"),
        param("join", "abc", (", ",), "abc", id="join-non-list-unchanged"),
        param("upper", "ab", (), "AB", id="upper"),
        param("upper", None, (), None, id="upper-none"),
        param("upper", 1.0, (), "1", id="upper-number"),
        param("lower", "AB", (), "ab", id="lower"),
        param("trim", "\ufeff a \x85", (), "a \x85", id="trim-js-semantics"),
        param("length", [1, 2], (), 2, id="length-list"),
        param("length", "héllo", (), 5, id="length-string"),
        param("length", {"a": 1}, (), 1, id="length-mapping"),
        param("length", 5, (), None, id="length-number"),
        param("bullets", ["a", "b"], ("  - ",), "  - a\n  - b", id="bullets"),
        param("bullets", [], ("- ",), "", id="bullets-empty"),
        param("bullets", "solo", (), "- solo", id="bullets-scalar"),
        param("bullets", None, (), None, id="bullets-none"),
        param("numbered", ["a", "b"], (), "[1] a\n[2] b", id="numbered"),
        param("numbered", ["a", "b"], ("#. ",), "1. a\n2. b", id="numbered-format"),
        param("numbered", ["a", "b"], ("(#) ", 0), "(0) a\n(1) b", id="numbered-start"),
        param("first", [3, 4], (), 3, id="first"),
        param("first", [], (), None, id="first-empty"),
        param("last", "abc", (), "c", id="last-string"),
        param("indent", "a\nb\n\nc", (2,), "a\n  b\n\n  c", id="indent"),
        param("indent", "a\nb", (2, True), "  a\n  b", id="indent-first"),
        param("indent", "a\nb", ("> ",), "a\n> b", id="indent-string"),
        param("replace", "a-b-c", ("-", "+"), "a+b+c", id="replace"),
        param("replace", "abc", ("",), "abc", id="replace-empty-old"),
        param("json", 'a"b', (), '"a\\"b"', id="json-string"),
        param("json", {"a": [1.0]}, (), '{"a":[1]}', id="json-mapping"),
        param("json", None, (), "null", id="json-none"),
    ],
)
def test_filters(name: str, value: Any, args: tuple[Any, ...], expected: Any) -> None:
    """Each filter maps values as documented and never raises on odd input."""
    assert _filter(name, value, *args) == expected


@given(
    st.sampled_from(sorted(filters.FILTERS)),
    shallow_json_values(),
    st.lists(shallow_json_values(1), max_size=2),
)
def test_filters_are_total(name: str, value: Any, args: list[Any]) -> None:
    """No filter raises for any JSON-like value and arguments within its arity."""
    spec = filters.FILTERS[name]
    args = args[: spec.max_args]
    if len(args) < spec.min_args:
        args = args + ["x"] * (spec.min_args - len(args))
    result = spec.fn(value, *args)
    assert isinstance(to_text(result), str)


def test_indent_width_is_capped() -> None:
    """indent never pads more than MAX_INDENT characters, whatever width it is given."""
    text = _filter("indent", "a\nb", 10**12)
    assert text == "a\n" + " " * filters.MAX_INDENT + "b"
    assert _filter("indent", "a\nb", math.inf) == "a\n    b"


def test_replace_cannot_amplify_past_the_output_limit() -> None:
    """A replacement that would grow the text past MAX_RENDER_CHARS raises RenderLimitError."""
    from storyforge.errors import RenderLimitError

    with pytest.raises(RenderLimitError, match="MAX_RENDER_CHARS"):
        _filter("replace", "a" * 2_000, "a", "b" * 1_000)
