"""Source building blocks: context readers, handlers with and without argument checks, tables."""

from __future__ import annotations

from typing import Any

import pytest
from pytest import param

from storyforge.engine.frozen import FrozenDict
from storyforge.engine.sources import (
    ORDER,
    POSITIVE_INT,
    ArgRule,
    ContextSource,
    SourceSpec,
    SourceTable,
    field_registry,
    read_field,
    read_list,
    source_handler,
)

SPECS = (SourceSpec(name="theme", returns="str"), SourceSpec(name="banned", returns="list[str]"))


@pytest.mark.parametrize(
    ("required", "ctx", "expected"),
    [
        param(False, {"theme": "luck"}, "luck", id="present"),
        param(False, {}, None, id="missing-is-none"),
        param(True, {"theme": "luck"}, "luck", id="required-present"),
        param(True, {}, KeyError, id="required-missing-raises"),
    ],
)
def test_field_registry_reads_the_field_named_like_the_source(
    required: bool, ctx: Any, expected: Any
) -> None:
    """field_registry's handlers give ctx[name]; a missing field is None, or KeyError when required."""
    handler = field_registry(SPECS, required=required)["theme"]
    if expected is KeyError:
        with pytest.raises(KeyError):
            handler(ctx, None)
    else:
        assert handler(ctx, {"anything": 1}) == expected


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        param({"xs": [3, 1, 2]}, [1, 2, 3], id="list"),
        param({"xs": (2, 1)}, [1, 2], id="tuple"),
        param({"xs": None}, [], id="null"),
        param({}, [], id="missing"),
        param({"xs": "abc"}, TypeError("context field 'xs' must be a list, got str"), id="not-a-list"),
    ],
)
def test_read_list_normalises_the_field_before_selecting(ctx: Any, expected: Any) -> None:
    """read_list turns a missing or null field into [], refuses a non-list, then applies select."""
    select = read_list("xs", lambda items, args: sorted(items))
    if isinstance(expected, Exception):
        with pytest.raises(TypeError, match=f"^{expected}$"):
            select(ctx, {})
    else:
        assert select(ctx, {}) == expected


def test_a_checked_handler_raises_on_bad_args_and_a_non_mapping_context() -> None:
    """With rules, bad args are a ValueError naming source and arg, a non-mapping ctx a TypeError."""
    handler = source_handler("xs", read_list("xs"), {"limit": POSITIVE_INT})
    assert handler.__name__ == "source_xs"
    assert handler({"xs": [1]}, None) == [1]
    with pytest.raises(ValueError, match=r"^arg 'limit' of source 'xs' must be int >= 1, got 0$"):
        handler({"xs": [1]}, {"limit": 0})
    with pytest.raises(TypeError, match="^the context must be a mapping, got list$"):
        handler([], None)


def test_a_checked_handler_remembers_only_frozen_args_that_cannot_change() -> None:
    """Frozen args that passed are not checked again; frozen args holding a mutable value, and
    plain dicts, are checked on every call (their verdict could change)."""
    calls: list[Any] = []
    rule = ArgRule(
        describe="list[str]", check=lambda v: calls.append(v) or all(isinstance(x, str) for x in v)
    )
    handler = source_handler("xs", read_list("xs"), {"names": rule})
    frozen = FrozenDict({"names": ("a",)})
    handler({"xs": [1]}, frozen)
    handler({"xs": [1]}, frozen)
    assert len(calls) == 1
    names = ["a"]
    mutable = FrozenDict({"names": names})
    handler({"xs": [1]}, mutable)
    names.append(2)
    with pytest.raises(ValueError, match="names"):
        handler({"xs": [1]}, mutable)
    plain = {"names": ["a"]}
    handler({"xs": [1]}, plain)
    handler({"xs": [1]}, plain)
    assert len(calls) == 5


def test_an_unchecked_handler_passes_args_through() -> None:
    """Without rules, args reach the selector as they are ({} for none)."""
    seen: list[Any] = []
    handler = source_handler("x", lambda ctx, args: seen.append(args))
    handler({}, None)
    handler({}, {"limit": "many"})
    assert seen == [{}, {"limit": "many"}]


def test_a_table_publishes_specs_rules_registry_and_checks_from_one_row_per_source() -> None:
    """SourceTable's specs, rules, handlers and check_args all come from the same rows."""
    table = SourceTable(
        ContextSource(
            name="xs",
            returns="list[int]",
            rules={"order": ORDER},
            select=read_list("xs", lambda items, args: sorted(items, reverse=args.get("order") == "desc")),
            description="Numbers.",
        ),
        ContextSource(name="title", returns="str", select=read_field("name")),
    )
    assert [(s.name, dict(s.args), s.returns) for s in table.specs] == [
        ("xs", {"order": "'asc' | 'desc'"}, "list[int]"),
        ("title", {}, "str"),
    ]
    assert set(table.rules) == {"xs", "title"} and dict(table.rules["title"]) == {}
    ctx = {"xs": [2, 3, 1], "name": "N"}
    registry = table.registry_for(ctx)
    assert registry is table.registry_for({})
    assert registry["xs"](ctx, {"order": "desc"}) == [3, 2, 1]
    assert registry["title"](ctx, None) == "N"
    assert table.check_args("xs", {"order": "up"}) == [
        "arg 'order' of source 'xs' must be 'asc' | 'desc', got \"up\""
    ]
    assert table.check_args("xs", {"unknown": 1}) == []  # unknown names are the linter's to report
