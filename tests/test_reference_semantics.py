"""The reference semantics end to end, section by section (docs/reference-semantics.md).

Each row renders a small template through the public API; the four [BUG] decisions of §11 are
pinned to storyforge's behaviour, not the reference's.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from storyforge import SourceRegistry, TemplateValidationError, compile_template, render


def tpl(slots: dict[str, Any], layout: list[Any] | None = None) -> dict[str, Any]:
    return {
        "id": "ref",
        "name": "Reference probe",
        "task": "probe",
        "version": 1,
        "layout": layout if layout is not None else [{"kind": "slot", "name": n} for n in slots],
        "slots": slots,
    }


def one(content: str, ctx: dict[str, Any]) -> str:
    """Render a single layout message and return its text ("" when nothing was emitted)."""
    compiled = compile_template(tpl({}, [{"kind": "message", "role": "user", "content": content}]))
    messages = render(compiled, ctx, SourceRegistry()).messages
    return messages[0]["content"] if messages else ""


def value_of(ref: dict[str, Any], ctx: dict[str, Any], items: list[Any] | None = None) -> list[str]:
    """Texts a `from` ref gives, at top level or inside a loop over `items`."""
    node = {"kind": "message", "role": "user", "from": ref}
    plan = (
        [{"kind": "forEach", "source": {"source": "items"}, "map": [node]}] if items is not None else [node]
    )
    compiled = compile_template(tpl({"s": {"priority": 0, "plan": plan}}))
    registry = SourceRegistry({"items": lambda c, a: items})
    return [r[4] for r in render(compiled, ctx, registry).trace.raw if r[0] == "message" and r[2] is None]


# -- §5 leaf interpolation through the renderer ----------------------------------------------------

LEAF_CASES = [
    pytest.param("{{vessel}} and {{ctx.vessel}}", {"vessel": "Ark"}, "Ark and Ark", id="ctx-and-direct"),
    pytest.param("[{{item}}]", {"item": "hidden"}, "[]", id="item-hides-ctx-key"),
    pytest.param("{{ctx.item}}", {"item": "reachable"}, "reachable", id="ctx-item-reachable"),
    pytest.param("{{title}}", {"title": None, "globals": {"title": "X"}}, "", id="null-counts-as-found"),
    pytest.param(
        "{{hull.paint}}",
        {"hull": {}, "globals": {"hull": {"paint": "red"}}},
        "red",
        id="globals-fallback-whole-path",
    ),
    pytest.param("{{missing}}|{{a.b.c}}", {"a": {"b": None}}, "|", id="missing-paths-empty"),
    pytest.param(
        "{{n}} {{f}} {{b}} {{z}}", {"n": 0, "f": 2.0, "b": False, "z": ""}, "0 2 false ", id="scalars"
    ),
    pytest.param("{{o}} {{l}}", {"o": {"crates": 3.0}, "l": [1, "x"]}, '{"crates":3} [1,"x"]', id="json"),
    pytest.param("{{arr.length}} {{s.length}}", {"arr": [1, 2], "s": "abc"}, "2 ", id="length-on-lists-only"),
    pytest.param(
        "{{a[0].name}} {{a.0.name}} {{d[beam.m]}}",
        {"a": [{"name": "x"}], "d": {"beam.m": 4}},
        "x x 4",
        id="bracket-forms",
    ),
    pytest.param("{{a.-1}}{{a.01}}{{a.5}}", {"a": [1, 2]}, "", id="non-canonical-indices"),
    pytest.param("{{unclosed and {{x}}", {"x": 1}, "{{unclosed and 1", id="unclosed-literal"),
    pytest.param("{{{x}}}", {"x": 1}, "{1}", id="triple-braces"),
    pytest.param("{{ }}", {"a": 1}, "", id="bug-3-empty-path-renders-empty"),
    pytest.param("{{a}}", {"a": "x {{a}} y"}, "x x x x x x {{a}} y y y y y y", id="self-expansion-capped"),
    pytest.param("{{a}}", {"a": "<{{b}}>", "b": "{{c}}", "c": "C"}, "<C>", id="chain-expansion"),
    pytest.param("{{n}}", {"n": 1e-7}, "1e-7", id="js-small-float"),
    pytest.param("{{n}}", {"n": 2**60}, str(2**60), id="big-int-exact"),
    pytest.param("{{n}}", {"n": math.nan}, "NaN", id="nan"),
]


@pytest.mark.parametrize(("content", "ctx", "text"), LEAF_CASES)
def test_leaf_interpolation(content: str, ctx: dict[str, Any], text: str) -> None:
    """§5: scope, paths, globals fallback, value formatting and recursive expansion."""
    assert one(content, ctx) == text


# -- §6.2 reserved sources -----------------------------------------------------------------------

RESERVED_CASES = [
    pytest.param(
        {"source": "$ctx", "args": {"path": "a.b"}}, {"a": {"b": "deep"}}, None, ["deep"], id="ctx-path"
    ),
    pytest.param(
        {"source": "$ctx", "args": {"path": ""}}, {"k": 1}, None, ['{"k":1}'], id="ctx-empty-path-whole"
    ),
    pytest.param(
        {"source": "$globals", "args": {"path": "tone"}},
        {"globals": {"tone": "dry"}},
        None,
        ["dry"],
        id="globals",
    ),
    pytest.param({"source": "$globals"}, {"other": 1}, None, [], id="globals-absent"),
    pytest.param(
        {"source": "$ctx", "args": {"path": "x"}}, {"globals": {"x": 1}}, None, [], id="no-globals-fallback"
    ),
    pytest.param({"source": "$item"}, {}, None, [], id="item-outside-loop-absent"),
    pytest.param({"source": "$index"}, {}, None, [], id="index-outside-loop-absent"),
    pytest.param(
        {"source": "$item", "args": {"path": "n"}}, {}, [{"n": 1}, {"n": 2}], ["1", "2"], id="item-path"
    ),
    pytest.param({"source": "$index"}, {}, ["a", "b"], ["0", "1"], id="index"),
    pytest.param({"source": "$parent"}, {}, ["a"], [], id="parent-beyond-frames-absent"),
    pytest.param({"source": "$parent", "args": {"level": 0}}, {}, ["a"], [], id="parent-level-raised-to-1"),
]


@pytest.mark.parametrize(("ref", "ctx", "items", "texts"), RESERVED_CASES)
def test_reserved_sources(
    ref: dict[str, Any], ctx: dict[str, Any], items: list[Any] | None, texts: list[str]
) -> None:
    """§6.2: $ctx, $globals, $item, $index and $parent, with paths and without a globals fallback."""
    assert value_of(ref, ctx, items) == texts


def test_reserved_names_shadow_registry_handlers() -> None:
    """A registry handler named like a reserved source is never called."""
    calls: list[int] = []
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "plan": [
                        {"kind": "message", "role": "user", "from": {"source": "$ctx", "args": {"path": "v"}}}
                    ],
                }
            }
        )
    )
    out = render(compiled, {"v": "real"}, SourceRegistry({"$ctx": lambda c, a: calls.append(1) or "fake"}))
    assert out.messages[0]["content"] == "real" and calls == []


# -- §7 conditions, through slot `when` ----------------------------------------------------------

CONDITION_CASES = [
    ("exists", 0, None, True),
    ("exists", "", None, True),
    ("exists", False, None, True),
    ("exists", [], None, True),
    ("exists", {}, None, True),
    ("exists", None, None, False),
    ("nonEmpty", [0], None, True),
    ("nonEmpty", " ", None, True),
    ("nonEmpty", [], None, False),
    ("nonEmpty", "", None, False),
    ("nonEmpty", {"a": 1}, None, False),
    ("nonEmpty", 5, None, False),
    ("eq", 2.0, 2, True),
    ("eq", "5", 5, False),
    ("eq", True, 1, False),
    ("eq", [True], [1], False),
    ("eq", None, None, True),
    ("eq", {"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
    ("eq", [1, 2], [2, 1], False),
    ("neq", "a", "b", True),
    ("neq", None, None, False),
    ("gt", 3, 2, True),
    ("gt", 2, 2, False),
    ("gt", "3", 2, False),
    ("gt", True, 0, False),
    ("gt", math.inf, 1e308, True),
    ("gt", math.nan, 1, False),
    ("lt", -math.inf, 0, True),
    ("lt", None, 1, False),
    ("lt", [1], 2, False),
]


@pytest.mark.parametrize(
    ("kind", "value", "expected_value", "holds"),
    CONDITION_CASES,
    ids=[f"{c[0]}-{c[1]!r}-{c[2]!r}" for c in CONDITION_CASES],
)
def test_condition_truth_table(kind: str, value: Any, expected_value: Any, holds: bool) -> None:
    """§7: exists, nonEmpty, eq (structural, decision #4), neq, gt and lt on real numbers only."""
    when: dict[str, Any] = {"type": kind, "ref": {"source": "v"}}
    if kind not in ("exists", "nonEmpty"):
        when["value"] = expected_value
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "when": when,
                    "plan": [{"kind": "message", "role": "user", "content": "yes"}],
                }
            }
        )
    )
    messages = render(compiled, {}, SourceRegistry({"v": lambda c, a: value})).messages
    assert bool(messages) is holds


def test_condition_missing_value_is_undefined() -> None:
    """§2.7/#19/#20: eq without value is accepted and compares as missing, which is not null."""
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "when": {"type": "eq", "ref": {"source": "v"}},
                    "plan": [{"kind": "message", "role": "user", "content": "yes"}],
                }
            }
        )
    )
    assert not render(compiled, {}, SourceRegistry({"v": lambda c, a: None})).messages
    assert not render(compiled, {}, SourceRegistry({"v": lambda c, a: 0})).messages
    assert render(compiled, {}, SourceRegistry({})).messages


# -- §11 flagged behaviours and decisions ------------------------------------------------------


def loop_with_separator(fill: str) -> dict[str, Any]:
    return tpl(
        {
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "xs"},
                        "fillDir": fill,
                        "interleave": {"kind": "separator", "text": "sep"},
                        "map": [{"kind": "message", "role": "assistant", "content": "{{item}}"}],
                    }
                ],
            }
        }
    )


def test_decision_1_separators_follow_fill_direction() -> None:
    """#1 [BUG]: with prepend, separators sit between groups (not piled up at the end)."""
    out = render(
        compile_template(loop_with_separator("prepend")),
        {},
        SourceRegistry({"xs": lambda c, a: ["p", "q", "r"]}),
    ).messages
    assert [m["content"] for m in out] == ["r", "sep", "q", "sep", "p"]


def test_decision_2_prefix_survives_squash() -> None:
    """#2 [BUG]: plain assistant text followed by a prefill keeps prefix: True."""
    compiled = compile_template(
        tpl(
            {},
            [
                {"kind": "message", "role": "assistant", "content": "one"},
                {"kind": "message", "role": "assistant", "content": "two"},
                {"kind": "message", "role": "assistant", "content": "Bearing:", "prefix": True},
            ],
        )
    )
    assert render(compiled, {}, SourceRegistry()).messages == [
        {"role": "assistant", "content": "one\ntwo\nBearing:", "prefix": True}
    ]


def test_decision_3_empty_path_renders_empty() -> None:
    """#3 [BUG]: {{ }} renders "" instead of the whole scope."""
    assert one("a{{ }}b", {"secret": 1}) == "ab"


def test_decision_4_eq_ignores_key_order() -> None:
    """#4 [BUG]: eq on mappings is structural, not key-order dependent."""
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "plan": [
                        {
                            "kind": "if",
                            "when": {
                                "type": "eq",
                                "ref": {"source": "v"},
                                "value": {"b": [1, {"y": 2, "x": 1}], "a": 1},
                            },
                            "then": [{"kind": "message", "role": "user", "content": "same"}],
                        }
                    ],
                }
            }
        )
    )
    value = {"a": 1, "b": [1, {"x": 1, "y": 2}]}
    assert render(compiled, {}, SourceRegistry({"v": lambda c, a: value})).messages[0]["content"] == "same"


def test_decision_5_compile_deep_copies_args_and_values() -> None:
    """#5: compiling leaves args/values mutable in the caller's hands and isolated from the result."""
    args = {"limit": 1}
    value = [1]
    doc = tpl(
        {
            "s": {
                "priority": 0,
                "when": {"type": "eq", "ref": {"source": "v"}, "value": value},
                "plan": [{"kind": "message", "role": "user", "from": {"source": "x", "args": args}}],
            }
        }
    )
    compiled = compile_template(doc)
    args["limit"] = 2
    value.append(2)
    seen: list[Any] = []
    render(compiled, {}, SourceRegistry({"v": lambda c, a: [1], "x": lambda c, a: seen.append(a) or "ok"}))
    assert seen == [{"limit": 1}]


def test_6_layout_budgeted_after_slots() -> None:
    """#6: a big slot can crowd out the system prompt."""
    compiled = compile_template(
        tpl(
            {"s": {"priority": 0, "plan": [{"kind": "message", "role": "user", "content": "x" * 36}]}},
            [
                {"kind": "message", "role": "system", "content": "System prompt"},
                {"kind": "slot", "name": "s"},
            ],
        )
    )
    assert [m["role"] for m in render(compiled, {}, SourceRegistry(), budget=10).messages] == ["user"]


def test_9_order_does_nothing_for_objects() -> None:
    """#9: desc does not reverse a list of mappings."""
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "plan": [
                        {
                            "kind": "forEach",
                            "source": {"source": "xs"},
                            "order": "desc",
                            "map": [
                                {
                                    "kind": "message",
                                    "role": "user",
                                    "from": {"source": "$item", "args": {"path": "n"}},
                                }
                            ],
                        }
                    ],
                }
            }
        )
    )
    out = render(compiled, {}, SourceRegistry({"xs": lambda c, a: [{"n": 1}, {"n": 2}]})).messages
    assert out[0]["content"] == "1\n2"


def test_12_missing_layout_slot_is_a_validation_error() -> None:
    """#12/§3: a layout slot that does not exist fails compilation naming the slot."""
    with pytest.raises(TemplateValidationError, match='non-existent slot: "ghost"'):
        compile_template(tpl({}, [{"kind": "slot", "name": "ghost"}]))


def test_13_unknown_keys_are_dropped() -> None:
    """#13: a layout message's budget is ignored (unknown keys are stripped)."""
    compiled = compile_template(
        tpl({}, [{"kind": "message", "role": "user", "content": "x" * 40, "budget": {"maxTokens": 1}}])
    )
    assert render(compiled, {}, SourceRegistry()).messages == [{"role": "user", "content": "x" * 40}]


def test_17_missing_handler_silent_throwing_handler_warns() -> None:
    """#17: no handler -> no warning; a throwing handler -> exactly one warning."""
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "plan": [
                        {"kind": "message", "role": "user", "from": {"source": "none"}},
                        {"kind": "message", "role": "user", "from": {"source": "bad"}},
                    ],
                }
            }
        )
    )
    result = render(compiled, {"k": 1}, SourceRegistry({"bad": lambda c, a: {}["x"]}))
    assert result.warnings == ["""Unresolvable DataRef {"source":"bad"} in context with k ('x')"""]


# -- §12 integration ---------------------------------------------------------------------------


def test_step_outputs_through_args_and_item_in_if_and_from() -> None:
    """Args carry step names to the handler; $item works in if conditions and from inside loops."""
    steps = {"plan": ["go north", "", "rest"]}
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "plan": [
                        {
                            "kind": "forEach",
                            "source": {"source": "stepOutput", "args": {"step": "plan"}},
                            "map": [
                                {
                                    "kind": "if",
                                    "when": {"type": "nonEmpty", "ref": {"source": "$item"}},
                                    "then": [
                                        {"kind": "message", "role": "user", "from": {"source": "$item"}}
                                    ],
                                }
                            ],
                        }
                    ],
                }
            }
        )
    )
    registry = SourceRegistry({"stepOutput": lambda ctx, args: ctx["steps"][args["step"]]})
    assert render(compiled, {"steps": steps}, registry).messages == [
        {"role": "user", "content": "go north\nrest"}
    ]


def test_budget_cutoff_is_deterministic() -> None:
    """The same input under the same budget gives the same messages and warnings every time."""
    compiled = compile_template(
        tpl(
            {
                "h": {
                    "priority": 0,
                    "budget": {"maxTokens": 20},
                    "plan": [
                        {
                            "kind": "forEach",
                            "source": {"source": "turns"},
                            "order": "desc",
                            "fillDir": "prepend",
                            "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                        }
                    ],
                }
            }
        )
    )
    registry = SourceRegistry({"turns": lambda c, a: [f"turn {i} " * (i % 4 + 1) for i in range(30)]})
    first = render(compiled, {}, registry, budget=15)
    for _ in range(5):
        again = render(compiled, {}, registry, budget=15)
        assert again.messages == first.messages and again.warnings == first.warnings


def test_slot_when_and_layout_refs_have_no_frames() -> None:
    """§6.2: slot `when` conditions and layout DataRefs see no loop frames ($item/$index absent)."""
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "when": {"type": "exists", "ref": {"source": "$item"}},
                    "plan": [{"kind": "message", "role": "user", "content": "never"}],
                }
            },
            [
                {"kind": "message", "role": "system", "from": {"source": "$index"}},
                {
                    "kind": "slot",
                    "name": "s",
                    "omitIfEmpty": False,
                    "header": {"role": "user", "from": {"source": "$item"}},
                },
                {"kind": "message", "role": "assistant", "content": "end"},
            ],
        )
    )
    assert render(compiled, {}, SourceRegistry()).messages == [{"role": "assistant", "content": "end"}]


def test_circular_value_in_eq_is_false() -> None:
    """§7: eq against a value that contains itself is false, not an error."""
    circular: list[Any] = []
    circular.append(circular)
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "when": {"type": "eq", "ref": {"source": "v"}, "value": [[]]},
                    "plan": [{"kind": "message", "role": "user", "content": "yes"}],
                }
            }
        )
    )
    result = render(compiled, {}, SourceRegistry({"v": lambda c, a: circular}))
    assert result.messages == [] and result.warnings == []


@pytest.mark.parametrize(("stop", "probed"), [(True, 0), (False, 1)])
def test_stop_skips_the_rest_of_the_current_item(stop: bool, probed: int) -> None:
    """§9.1: once the global budget is gone mid-item, stopWhenOutOfBudget skips that item's
    remaining children (so their sources are not even resolved)."""
    calls: list[int] = []
    compiled = compile_template(
        tpl(
            {
                "s": {
                    "priority": 0,
                    "plan": [
                        {
                            "kind": "forEach",
                            "source": {"source": "xs"},
                            "stopWhenOutOfBudget": stop,
                            "map": [
                                {"kind": "message", "role": "user", "content": "{{item}}"},
                                {
                                    "kind": "if",
                                    "when": {"type": "exists", "ref": {"source": "probe"}},
                                    "then": [{"kind": "message", "role": "user", "content": "p"}],
                                },
                            ],
                        }
                    ],
                }
            }
        )
    )
    registry = SourceRegistry({"xs": lambda c, a: ["abcdefgh"], "probe": lambda c, a: calls.append(1) or 1})
    assert render(compiled, {}, registry, budget=2).messages == [{"role": "user", "content": "abcdefgh"}]
    assert len(calls) == probed
