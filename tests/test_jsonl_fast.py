"""jsonl_line takes a fast encoder when it can, and its bytes are always json's."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge.atomic import jsonl_line

_REFERENCE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def reference(record: Any) -> bytes:
    return (_REFERENCE.encode(record) + "\n").encode()


class Word(str):
    pass


class Count(enum.IntEnum):
    ONE = 1


@dataclass
class Point:
    x: int


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _cycle() -> dict[str, Any]:
    record: dict[str, Any] = {"a": []}
    record["a"].append(record)
    return record


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _values, max_size=6))
def test_bytes_equal_json(record: dict[str, Any]) -> None:
    assert jsonl_line(record) == reference(record)


@pytest.mark.parametrize(
    "record",
    [
        {"x": 1e-05},
        {"x": 1e16},
        {"x": 100.0},
        {"x": -0.0},
        {"x": 2**70},
        {"x": "1.5e3 null"},
        {"x": '\u2028\x00\x1f\x7f"\\'},
        {"x": (1, 2)},
        {"x": Word("w")},
        {"x": Count.ONE},
        {1: "int key"},
        {"x": {True: 1, None: 2}},
        {"x": _nested(300)},
        {"x": _nested(900)},
    ],
)
def test_bytes_equal_json_table(record: dict[Any, Any]) -> None:
    assert jsonl_line(record) == reference(record)


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"x": float("nan")}, ValueError),
        ({"x": float("inf")}, ValueError),
        ({"x": Point(1)}, TypeError),
        ({"x": "\ud800"}, UnicodeEncodeError),
        (_cycle(), ValueError),
    ],
)
def test_refuses_what_json_refuses(record: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        reference(record)
    with pytest.raises(error):
        jsonl_line(record)
