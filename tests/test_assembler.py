"""Render phases B and C: layout assembly, headers/footers, omitIfEmpty, squashing (§9.2, §9.3, §10)."""

from __future__ import annotations

from typing import Any

import pytest

from storyforge import SourceRegistry, compile_template, render
from storyforge.engine.assembler import squash


def tpl(layout: list[Any], slots: dict[str, Any]) -> dict[str, Any]:
    return {"id": "t", "name": "T", "task": "demo", "version": 1, "layout": layout, "slots": slots}


def slot(*plan: Any, priority: int = 0, **extra: Any) -> dict[str, Any]:
    return {"priority": priority, "plan": list(plan), **extra}


def msg(content: str | None = None, role: str = "user", **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"kind": "message", "role": role, **extra}
    if content is not None:
        node["content"] = content
    return node


def block(content: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def run(
    layout: list[Any],
    slots: dict[str, Any],
    ctx: dict[str, Any] | None = None,
    handlers: dict[str, Any] | None = None,
    budget: int | None = None,
) -> list[dict[str, Any]]:
    compiled = compile_template(tpl(layout, slots))
    return render(compiled, ctx or {}, SourceRegistry(handlers or {}), budget=budget).messages


def pairs(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


WORKED = (
    [msg("SSSSSSSS", role="system"), {"kind": "slot", "name": "s"}, msg("tail")],
    {"s": slot(msg("aaaaaaaa", role="assistant"))},
)


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        pytest.param(3, [("assistant", "aaaaaaaa"), ("user", "tail")], id="budget-3"),
        pytest.param(2, [("assistant", "aaaaaaaa")], id="budget-2"),
        pytest.param(4, [("system", "SSSSSSSS"), ("assistant", "aaaaaaaa")], id="budget-4"),
        pytest.param(5, [("system", "SSSSSSSS"), ("assistant", "aaaaaaaa"), ("user", "tail")], id="budget-5"),
        pytest.param(
            None, [("system", "SSSSSSSS"), ("assistant", "aaaaaaaa"), ("user", "tail")], id="unlimited"
        ),
    ],
)
def test_worked_budget_example(budget: int | None, expected: list[tuple[str, str]]) -> None:
    """§10: slots are paid first; layout messages get what is left, and later small ones still fit."""
    assert pairs(run(*WORKED, budget=budget)) == expected


def test_zero_budget_emits_nothing_at_all() -> None:
    """A global budget of 0 emits nothing, not even layout messages."""
    assert run(*WORKED, budget=0) == []


def test_slot_buffer_inserted_without_second_check() -> None:
    """Slot messages were paid in phase A and are inserted even after the budget ran out."""
    layout = [{"kind": "slot", "name": "a", "header": block("HHHH")}, {"kind": "slot", "name": "b"}]
    slots = {"a": slot(msg("a" * 4)), "b": slot(msg("b" * 4, role="assistant"), priority=1)}
    assert pairs(run(layout, slots, budget=2)) == [("user", "a" * 4), ("assistant", "b" * 4)]


def test_headers_and_footers_in_order_around_the_buffer() -> None:
    """Headers come first in order, then the buffer, then footers in order."""
    layout = [
        {
            "kind": "slot",
            "name": "s",
            "header": [block("h1"), block("h2", role="system")],
            "footer": [block("f1", role="assistant"), block("f2")],
        }
    ]
    out = run(layout, {"s": slot(msg("body"))})
    assert pairs(out) == [
        ("user", "h1"),
        ("system", "h2"),
        ("user", "body"),
        ("assistant", "f1"),
        ("user", "f2"),
    ]


def test_header_dropped_for_budget_body_stays() -> None:
    """A header that does not fit is dropped; the slot's messages stay."""
    layout = [{"kind": "slot", "name": "s", "header": block("H" * 20, role="system")}]
    assert pairs(run(layout, {"s": slot(msg("body"))}, budget=3)) == [("user", "body")]


def test_header_list_stops_at_first_block_that_does_not_fit() -> None:
    """Within one header list, the first block that does not fit ends the list."""
    layout = [
        {
            "kind": "slot",
            "name": "s",
            "header": [block("x" * 40, role="system"), block("h", role="system")],
            "footer": [block("{{nothing}}", role="assistant"), block("f", role="assistant")],
        }
    ]
    out = run(layout, {"s": slot(msg("body"))}, budget=5)
    assert pairs(out) == [("user", "body"), ("assistant", "f")]  # an empty footer is skipped, not a stop


def test_layout_message_that_does_not_fit_is_skipped_and_later_ones_tried() -> None:
    """A layout message over budget is skipped; later smaller layout messages still get in."""
    layout = [msg("L" * 40, role="system"), msg("ok"), {"kind": "slot", "name": "s"}]
    assert pairs(run(layout, {"s": slot()}, budget=2)) == [("user", "ok")]


@pytest.mark.parametrize(
    ("omit", "expected"),
    [
        pytest.param(None, [("user", "end")], id="default-omits"),
        pytest.param(True, [("user", "end")], id="true-omits"),
        pytest.param(False, [("system", "H"), ("assistant", "F"), ("user", "end")], id="false-keeps-header"),
    ],
)
def test_omit_if_empty(omit: bool | None, expected: list[tuple[str, str]]) -> None:
    """An empty slot drops its header/footer unless omitIfEmpty is literally false."""
    node: dict[str, Any] = {
        "kind": "slot",
        "name": "s",
        "header": block("H", role="system"),
        "footer": block("F", role="assistant"),
    }
    if omit is not None:
        node["omitIfEmpty"] = omit
    assert pairs(run([node, msg("end")], {"s": slot(msg("{{nothing}}"))})) == expected


def test_omit_if_empty_false_with_false_condition_keeps_header() -> None:
    """A slot whose when is false is empty; with omitIfEmpty false its header still shows."""
    layout = [{"kind": "slot", "name": "s", "header": block("Heading"), "omitIfEmpty": False}]
    slots = {"s": slot(msg("body"), when={"type": "exists", "ref": {"source": "none"}})}
    assert pairs(run(layout, slots)) == [("user", "Heading")]


def test_header_from_source_and_no_item_in_layout_scope() -> None:
    """Headers can use from; layout strings have no item in scope (ctx `item` is hidden)."""
    layout = [
        {"kind": "slot", "name": "s", "header": {"role": "system", "from": {"source": "h"}}},
        msg("[{{item}}|{{ctx.item}}]", role="assistant"),
    ]
    out = run(layout, {"s": slot(msg("body"))}, {"item": "ctx-item"}, {"h": lambda c, a: {"n": 1}})
    assert pairs(out) == [("system", '{"n":1}'), ("user", "body"), ("assistant", "[|ctx-item]")]


def test_layout_from_null_is_skipped() -> None:
    """A layout message whose from is null emits nothing."""
    layout = [{"kind": "message", "role": "system", "from": {"source": "none"}}, msg("x")]
    assert pairs(run(layout, {})) == [("user", "x")]


def test_same_slot_twice_is_inserted_twice() -> None:
    """A slot referred to twice has its buffer inserted twice (paid once)."""
    layout = [{"kind": "slot", "name": "s"}, msg("mid", role="system"), {"kind": "slot", "name": "s"}]
    assert pairs(run(layout, {"s": slot(msg("body"))}, budget=1)) == [("user", "body\nbody")]


def test_mixed_layout_keeps_order_and_prefix_on_layout_message() -> None:
    """Layout messages and slots come out in layout order; a layout prefill keeps its flag."""
    layout = [
        msg("sys", role="system"),
        {"kind": "slot", "name": "s"},
        msg("Answer:", role="assistant", prefix=True),
    ]
    out = run(layout, {"s": slot(msg("q"))})
    assert out == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Answer:", "prefix": True},
    ]


# -- squash ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("emitted", "expected"),
    [
        pytest.param([], [], id="empty"),
        pytest.param(
            [("user", "a", False), ("user", "b", False)],
            [{"role": "user", "content": "a\nb"}],
            id="same-role-joined-with-newline",
        ),
        pytest.param(
            [("user", "a", False), ("assistant", "b", False), ("user", "c", False)],
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            id="alternating",
        ),
        pytest.param(
            [("system", "a", False), ("system", "", False), ("system", " ", False)],
            [{"role": "system", "content": "a\n\n "}],
            id="any-role-any-text",
        ),
        pytest.param(
            [("assistant", "start", True), ("assistant", "more", False)],
            [{"role": "assistant", "content": "start\nmore", "prefix": True}],
            id="prefill-then-more",
        ),
        pytest.param(
            [("assistant", "one", False), ("assistant", "two", False), ("assistant", "Bearing:", True)],
            [{"role": "assistant", "content": "one\ntwo\nBearing:", "prefix": True}],
            id="plain-then-prefill-keeps-prefix",
        ),
        pytest.param(
            [
                ("system", "s", False),
                ("user", "a", False),
                ("user", "b", True),
                ("assistant", "x", False),
                ("user", "c", False),
                ("user", "d", False),
            ],
            [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "a\nb", "prefix": True},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "c\nd"},
            ],
            id="runs-in-the-middle-and-at-the-end",
        ),
    ],
)
def test_squash(emitted: list[tuple[str, str, bool]], expected: list[dict[str, Any]]) -> None:
    """Neighbours of the same role merge with one newline; prefix is the OR of the parts."""
    got = squash(emitted)
    assert got == expected
    assert [list(message) for message in got] == [list(message) for message in expected]  # key order


def test_squash_across_slot_header_and_layout_boundaries() -> None:
    """Squashing ignores where messages came from."""
    layout = [
        msg("intro"),
        {"kind": "slot", "name": "s", "header": block("head"), "footer": block("foot")},
        msg("outro"),
    ]
    assert pairs(run(layout, {"s": slot(msg("body"))})) == [("user", "intro\nhead\nbody\nfoot\noutro")]


def test_history_ending_on_assistant_then_prefill() -> None:
    """A history ending with an assistant turn followed by an assistant prefill stays prefilled."""
    layout = [{"kind": "slot", "name": "h"}, msg("Bearing:", role="assistant", prefix=True)]
    out = run(layout, {"h": slot(msg("q"), msg("a", role="assistant"))})
    assert out[-1] == {"role": "assistant", "content": "a\nBearing:", "prefix": True}
