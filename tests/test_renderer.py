"""Render phase A: message, forEach and if nodes, slots, resolvers, trace (§6, §9.1, §9.4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from storyforge import RenderError, RenderLimitError, SourceRegistry, compile_template, render
from storyforge.engine.renderer import collation_key, order_items


def tpl(slots: dict[str, Any], layout: list[Any] | None = None) -> dict[str, Any]:
    return {
        "id": "t",
        "name": "T",
        "task": "demo",
        "version": 1,
        "layout": layout if layout is not None else [{"kind": "slot", "name": n} for n in slots],
        "slots": slots,
    }


def slot(*plan: Any, priority: int = 0, **extra: Any) -> dict[str, Any]:
    return {"priority": priority, "plan": list(plan), **extra}


def msg(content: str | None = None, role: str = "user", **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"kind": "message", "role": role, **extra}
    if content is not None:
        node["content"] = content
    return node


def loop(source: str | dict[str, Any], *body: Any, **extra: Any) -> dict[str, Any]:
    ref = {"source": source} if isinstance(source, str) else source
    return {"kind": "forEach", "source": ref, "map": list(body), **extra}


def run(
    slots: dict[str, Any],
    ctx: dict[str, Any] | None = None,
    handlers: dict[str, Any] | None = None,
    *,
    budget: int | None = None,
    layout: list[Any] | None = None,
) -> Any:
    compiled = compile_template(tpl(slots, layout))
    return render(compiled, ctx or {}, SourceRegistry(handlers or {}), budget=budget)


def contents(result: Any) -> list[str]:
    return [m["content"] for m in result.messages]


def src(value: Any) -> Any:
    return lambda ctx, args: value


# -- message nodes -----------------------------------------------------------------------------


def test_from_takes_precedence_over_content() -> None:
    """With both from and content, the resolved from value is used."""
    r = run({"s": slot(msg("content", **{"from": {"source": "x"}}))}, handlers={"x": src("from-value")})
    assert contents(r) == ["from-value"]


def test_null_from_emits_nothing_without_fallback() -> None:
    """A null from emits nothing even when content is set (no fallback)."""
    r = run({"s": slot(msg("fallback", **{"from": {"source": "x"}}))}, handlers={"x": src(None)})
    assert r.messages == []


def test_missing_handler_resolves_to_nothing_silently() -> None:
    """A source without a handler is absent, with no warning."""
    r = run({"s": slot(msg(**{"from": {"source": "nobody"}}))})
    assert r.messages == [] and r.warnings == []


def test_from_string_is_not_interpolated() -> None:
    """A string from value is used as it is, placeholders included."""
    r = run({"s": slot(msg(**{"from": {"source": "x"}}))}, {"name": "Ada"}, {"x": src("Hi {{name}}")})
    assert contents(r) == ["Hi {{name}}"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(0, "0", id="zero"),
        pytest.param(False, "false", id="false"),
        pytest.param(True, "true", id="true"),
        pytest.param(2.0, "2", id="integral-float"),
        pytest.param(2.5, "2.5", id="float"),
        pytest.param(1e21, "1e+21", id="big-float"),
        pytest.param({"k": 1.0}, '{"k":1}', id="mapping-js-numbers"),
        pytest.param([1, "a", None, {"é": True}], '[1,"a",null,{"é":true}]', id="list-compact-unescaped"),
        pytest.param({"b": 1, "a": 2}, '{"b":1,"a":2}', id="insertion-order"),
        pytest.param("", None, id="empty-string-skipped"),
        pytest.param("  ", "  ", id="whitespace-kept"),
    ],
)
def test_from_values_are_json_encoded(value: Any, text: str | None) -> None:
    """Non-string from values are JSON-encoded with JS number formatting; "" emits nothing."""
    r = run({"s": slot(msg(**{"from": {"source": "x"}}))}, handlers={"x": src(value)})
    assert contents(r) == ([] if text is None else [text])


def test_circular_from_value_emits_nothing() -> None:
    """A value JSON cannot encode (circular) becomes "" and so emits nothing."""
    loop_value: list[Any] = []
    loop_value.append(loop_value)
    r = run({"s": slot(msg(**{"from": {"source": "x"}}))}, handlers={"x": src(loop_value)})
    assert r.messages == []


@pytest.mark.parametrize(
    ("content", "ctx", "emitted"),
    [
        pytest.param("Notes: {{a}}{{b}}", {}, False, id="all-missing"),
        pytest.param("Notes: {{a}}", {"a": "   "}, False, id="whitespace-only"),
        pytest.param("Notes: {{a}}", {"a": "\ufeff"}, False, id="js-trims-bom"),
        pytest.param("Notes: {{a}}", {"a": "\x1c"}, True, id="js-keeps-x1c"),
        pytest.param("Notes: {{a}} {{b}}", {"b": "x"}, True, id="one-contentful"),
        pytest.param("Notes: {{a}}", {"a": 0}, True, id="zero-is-content"),
        pytest.param("Static text", {}, True, id="no-variables"),
    ],
)
def test_skip_if_empty_interpolation(content: str, ctx: dict[str, Any], emitted: bool) -> None:
    """skipIfEmptyInterpolation skips a message whose placeholders all rendered blank."""
    r = run({"s": slot(msg(content, skipIfEmptyInterpolation=True))}, ctx)
    assert bool(r.messages) is emitted


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        pytest.param(msg(), [], id="neither-content-nor-from"),
        pytest.param(msg(""), [], id="empty-content"),
        pytest.param(msg("{{missing}}"), [], id="renders-empty"),
        pytest.param(msg(" "), [" "], id="whitespace-emitted"),
    ],
)
def test_empty_text_is_skipped(node: dict[str, Any], expected: list[str]) -> None:
    """Empty text emits nothing; whitespace-only text is emitted."""
    assert contents(run({"s": slot(node)})) == expected


def test_prefix_flag_kept_on_plan_message() -> None:
    """An assistant plan message with prefix: true is emitted with prefix True."""
    r = run({"s": slot(msg("Bearing:", role="assistant", prefix=True))})
    assert r.messages == [{"role": "assistant", "content": "Bearing:", "prefix": True}]


def test_prefix_false_leaves_key_out() -> None:
    """prefix: false never shows up in the output."""
    r = run({"s": slot(msg("x", role="assistant", prefix=False))})
    assert r.messages == [{"role": "assistant", "content": "x"}]


def test_node_budget_skips_only_that_message() -> None:
    """A message over its own budget is skipped whole; later nodes still run."""
    r = run(
        {
            "s": slot(
                msg("x" * 12, budget={"maxTokens": 2}), msg("y" * 8, budget={"maxTokens": 2}), msg("z" * 40)
            )
        }
    )
    assert contents(r) == ["y" * 8 + "\n" + "z" * 40]


def test_out_of_budget_message_calls_no_handler() -> None:
    """Once the global budget is gone, a message node returns before resolving its source."""
    calls: list[str] = []
    r = run(
        {"s": slot(msg("abcd"), msg(**{"from": {"source": "x"}}))},
        handlers={"x": lambda ctx, args: calls.append("x") or "late"},
        budget=1,
    )
    assert contents(r) == ["abcd"] and calls == []


# -- resolvers ---------------------------------------------------------------------------------


def test_handler_called_once_per_evaluation_with_args() -> None:
    """handler(ctx, args) is called once per evaluation; args is None when absent."""
    seen: list[Any] = []

    def handler(ctx: Any, args: Any) -> str:
        seen.append((ctx["who"], args))
        return "v"

    run(
        {
            "s": slot(
                msg(**{"from": {"source": "x"}}), msg(**{"from": {"source": "x", "args": {"n": [1, 2]}}})
            )
        },
        {"who": "me"},
        {"x": handler},
    )
    assert seen == [("me", None), ("me", {"n": (1, 2)})]


def test_handler_args_are_read_only_json() -> None:
    """Handlers get args they can read and JSON-encode, but not change."""
    got: list[Any] = []
    run(
        {"s": slot(msg(**{"from": {"source": "x", "args": {"k": {"n": 1}}}}))},
        handlers={"x": lambda ctx, args: got.append(args)},
    )
    (args,) = got
    assert json.dumps(args) == '{"k": {"n": 1}}'
    with pytest.raises(TypeError):
        args["k"] = 2
    with pytest.raises(TypeError):
        args["k"]["n"] = 2


def test_throwing_handler_gives_one_warning_in_reference_wording() -> None:
    """A handler that raises makes the data absent and adds exactly one warning."""

    def boom(ctx: Any, args: Any) -> Any:
        raise KeyError("turns")

    r = run(
        {"s": slot(msg("before"), msg(**{"from": {"source": "bad", "args": {"limit": 2}}}), msg("after"))},
        {"turns": [], "model": "m"},
        {"bad": boom},
    )
    assert contents(r) == ["before\nafter"]
    assert r.warnings == [
        """Unresolvable DataRef {"source":"bad","args":{"limit":2}} in context with turns, model ('turns')"""
    ]


def test_throwing_forEach_source_gives_empty_slot_and_warning() -> None:
    """A throwing forEach source empties the slot and warns once."""
    r = run({"s": slot(loop("bad", msg("{{item}}")))}, handlers={"bad": lambda c, a: 1 / 0})
    assert r.messages == []
    assert len(r.warnings) == 1 and "division by zero" in r.warnings[0]
    assert r.warnings[0].startswith('Unresolvable DataRef {"source":"bad"} in context with ')


def test_throwing_condition_source_is_false_and_warns() -> None:
    """A condition whose source raises counts as absent (false) and warns once."""
    r = run(
        {"s": slot(msg("x"), when={"type": "exists", "ref": {"source": "bad"}})},
        handlers={"bad": lambda c, a: {}["missing"]},
    )
    assert r.messages == [] and len(r.warnings) == 1


# -- forEach -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("abc", id="string"),
        pytest.param({"a": 1}, id="mapping"),
        pytest.param(None, id="none"),
        pytest.param(3, id="number"),
        pytest.param([], id="empty-list"),
    ],
)
def test_forEach_needs_a_non_empty_list(value: Any) -> None:
    """A source that is not a list (or is empty) emits nothing; strings are never iterated."""
    r = run({"s": slot(loop("xs", msg("[{{item}}]")))}, handlers={"xs": src(value)})
    assert r.messages == []


def test_forEach_accepts_tuples() -> None:
    """A tuple is a list."""
    assert contents(run({"s": slot(loop("xs", msg("{{item}}")))}, handlers={"xs": src(("a", "b"))})) == [
        "a\nb"
    ]


@pytest.mark.parametrize(
    ("items", "order", "expected"),
    [
        pytest.param([3, 1, 2.5, 10], "asc", [1, 2.5, 3, 10], id="numbers-asc"),
        pytest.param([3, 1, 2.5, 10], "desc", [10, 3, 2.5, 1], id="numbers-desc"),
        pytest.param(
            ["mizzen", "Keel", "anchor", "Boom"],
            "asc",
            ["anchor", "Boom", "Keel", "mizzen"],
            id="strings-locale-asc",
        ),
        pytest.param(["Apple", "apple"], "asc", ["apple", "Apple"], id="lower-case-first"),
        pytest.param(
            ["anchor", "Boom", "Keel", "mizzen"],
            "desc",
            ["mizzen", "Keel", "Boom", "anchor"],
            id="strings-desc",
        ),
        pytest.param(["b10", "b9", "a"], "asc", ["a", "b10", "b9"], id="digits-are-characters"),
        pytest.param([{"n": 2}, {"n": 1}], "asc", [{"n": 2}, {"n": 1}], id="objects-keep-order-asc"),
        pytest.param([{"n": 2}, {"n": 1}], "desc", [{"n": 2}, {"n": 1}], id="objects-desc-does-not-reverse"),
        pytest.param([True, False], "asc", [True, False], id="booleans-are-not-numbers"),
    ],
)
def test_order(items: list[Any], order: str, expected: list[Any]) -> None:
    """asc/desc: numbers numerically, strings by locale, everything else keeps source order."""
    assert order_items(items, order) == expected


def test_order_does_not_touch_the_source_list() -> None:
    """Ordering works on a copy."""
    items = [3, 1, 2]
    order_items(items, "asc")
    assert items == [3, 1, 2]


def test_collation_accents_are_secondary() -> None:
    """Accents only break ties left by the base letters."""
    assert sorted(["résumé", "resume", "rest"], key=collation_key) == ["rest", "resume", "résumé"]
    assert sorted(["côté", "côte", "coté", "cote"], key=collation_key) == ["cote", "coté", "côte", "côté"]


def test_limit_applies_after_order() -> None:
    """limit keeps the first items of the ordered list."""
    r = run({"s": slot(loop("xs", msg("{{item}}"), order="desc", limit=2))}, handlers={"xs": src([1, 5, 3])})
    assert contents(r) == ["5\n3"]


def test_fill_dir_prepend_reverses_groups_not_group_contents() -> None:
    """prepend puts each item's group first; messages inside a group keep their order."""
    r = run(
        {"s": slot(loop("xs", msg("{{item}}-a"), msg("{{item}}-b", role="assistant"), fillDir="prepend"))},
        handlers={"xs": src(["p", "q"])},
    )
    assert [(m["role"], m["content"]) for m in r.messages] == [
        ("user", "q-a"),
        ("assistant", "q-b"),
        ("user", "p-a"),
        ("assistant", "p-b"),
    ]


SEPARATED = {"kind": "separator", "text": "~{{item}}~"}


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        pytest.param("append", ["p", "~p~", "q", "~q~", "r"], id="append"),
        pytest.param("prepend", ["r", "~q~", "q", "~p~", "p"], id="prepend-follows-fill-direction"),
    ],
)
def test_separators(fill: str, expected: list[str]) -> None:
    """Separators go between items (none after the last), in the groups' fill direction."""
    r = run(
        {"s": slot(loop("xs", msg("{{item}}", role="assistant"), interleave=SEPARATED, fillDir=fill))},
        handlers={"xs": src(["p", "q", "r"])},
    )
    assert contents(r) == expected
    assert [m["role"] for m in r.messages] == ["assistant", "user", "assistant", "user", "assistant"]


def test_separator_follows_items_without_output() -> None:
    """A separator still follows an item whose group came out empty."""
    r = run(
        {
            "s": slot(
                loop(
                    "xs",
                    msg("{{item}}", role="assistant", skipIfEmptyInterpolation=True),
                    interleave={"kind": "separator", "text": "--"},
                )
            )
        },
        handlers={"xs": src(["", "b"])},
    )
    assert contents(r) == ["--", "b"]


def test_empty_separator_text_is_skipped() -> None:
    """A separator rendering to "" is silently left out."""
    r = run(
        {
            "s": slot(
                loop(
                    "xs",
                    msg("{{item}}", role="assistant"),
                    interleave={"kind": "separator", "text": "{{nothing}}"},
                )
            )
        },
        handlers={"xs": src(["a", "b"])},
    )
    assert contents(r) == ["a\nb"]


def test_index_is_position_in_ordered_limited_list() -> None:
    """$index counts iteration order after order and limit, also when prepending."""
    r = run(
        {
            "s": slot(
                loop(
                    "xs",
                    msg(**{"from": {"source": "$index"}}),
                    msg("{{item}}", role="assistant"),
                    order="asc",
                    limit=2,
                    fillDir="prepend",
                )
            )
        },
        handlers={"xs": src([30, 10, 20])},
    )
    assert contents(r) == ["1", "20", "0", "10"]


def test_parent_levels_and_item_paths() -> None:
    """$parent walks outer frames (level defaults to 1; too far is absent); $item takes a path."""
    ships = [{"name": "Ark", "cabins": [{"no": 1}, {"no": 2}]}]
    inner = loop(
        {"source": "$item", "args": {"path": "cabins"}},
        msg(**{"from": {"source": "$parent", "args": {"path": "name"}}}),
        msg(**{"from": {"source": "$item", "args": {"path": "no"}}}, role="assistant"),
        msg(**{"from": {"source": "$parent", "args": {"level": 2}}}, role="system"),
    )
    r = run({"s": slot(loop("ships", inner))}, handlers={"ships": src(ships)})
    assert contents(r) == ["Ark", "1", "Ark", "2"]


def test_template_variables_cannot_see_index_or_parent() -> None:
    """{{index}} and {{parent}} render empty inside loops; {{item}} is the current item."""
    r = run({"s": slot(loop("xs", msg("[{{index}}|{{parent}}|{{item}}]")))}, handlers={"xs": src(["a"])})
    assert contents(r) == ["[||a]"]


def test_local_budget_leaves_gaps() -> None:
    """With a 5-token cap, items costing 3, 3, 1, 1 give the 1st, 3rd and 4th."""
    texts = ["a" * 12, "b" * 12, "c" * 4, "d" * 4]
    r = run({"s": slot(loop("xs", msg("{{item}}"), budget={"maxTokens": 5}))}, handlers={"xs": src(texts)})
    assert contents(r) == ["a" * 12 + "\n" + "c" * 4 + "\n" + "d" * 4]


@pytest.mark.parametrize(("stop", "calls"), [(True, 1), (False, 3)])
def test_stop_when_out_of_budget_only_changes_handler_calls(stop: bool, calls: int) -> None:
    """Once the global budget is gone, stopWhenOutOfBudget stops the loop (fewer handler calls),
    while the messages are the same either way."""
    seen: list[Any] = []
    body = {"kind": "if", "when": {"type": "exists", "ref": {"source": "look"}}, "then": [msg("abcdefgh")]}
    r = run(
        {"s": slot(loop("xs", body, stopWhenOutOfBudget=stop))},
        handlers={"xs": src(["a", "b", "c"]), "look": lambda c, a: seen.append(1) or 1},
        budget=2,
    )
    assert contents(r) == ["abcdefgh"]
    assert len(seen) == calls


def test_budgeted_forEach_out_of_budget_does_not_resolve_source() -> None:
    """A forEach with a budget returns before resolving its source once the global budget is gone."""
    seen: list[str] = []
    r = run(
        {"s": slot(msg("abcd"), loop("xs", msg("{{item}}"), budget={}))},
        handlers={"xs": lambda c, a: seen.append("xs") or ["a"]},
        budget=1,
    )
    assert contents(r) == ["abcd"] and seen == []


def test_unbudgeted_forEach_still_resolves_when_out_of_budget() -> None:
    """Without a node budget the source is still resolved (then the loop stops at once)."""
    seen: list[str] = []
    run(
        {"s": slot(msg("abcd"), loop("xs", msg("{{item}}")))},
        handlers={"xs": lambda c, a: seen.append("xs") or ["a"]},
        budget=1,
    )
    assert seen == ["xs"]


# -- if ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "expected"), [(True, ["yes"]), (False, ["no"])])
def test_if_runs_then_or_else(flag: bool, expected: list[str]) -> None:
    """if runs then when the condition holds, else otherwise."""
    node = {
        "kind": "if",
        "when": {"type": "eq", "ref": {"source": "f"}, "value": True},
        "then": [msg("yes")],
        "else": [msg("no")],
    }
    assert contents(run({"s": slot(node)}, handlers={"f": src(flag)})) == expected


def test_if_without_else_emits_nothing_when_false() -> None:
    """A false if without else emits nothing."""
    node = {"kind": "if", "when": {"type": "exists", "ref": {"source": "none"}}, "then": [msg("yes")]}
    assert run({"s": slot(node)}).messages == []


def test_if_inside_loop_keeps_item_scope() -> None:
    """if branches see the loop's item, and $item works in the condition."""
    node = {
        "kind": "if",
        "when": {"type": "gt", "ref": {"source": "$item", "args": {"path": "n"}}, "value": 1},
        "then": [msg("big {{item.n}}")],
        "else": [msg("small {{item.n}}")],
    }
    r = run({"s": slot(loop("xs", node))}, handlers={"xs": src([{"n": 1}, {"n": 2}])})
    assert contents(r) == ["small 1\nbig 2"]


def test_string_condition_reads_sources_and_ctx() -> None:
    """A string condition can read sources and the context."""
    node = {
        "kind": "if",
        "when": "len(source('turns')) > 1 and ctx.model == 'llama3'",
        "then": [msg("long")],
        "else": [msg("short")],
    }
    compiled = compile_template(tpl({"s": slot(node)}), allowed_sources=["turns"])
    reg = SourceRegistry({"turns": lambda c, a: c["history"]})
    assert render(compiled, {"history": [1, 2], "model": "llama3"}, reg).messages[0]["content"] == "long"
    assert render(compiled, {"history": [1, 2], "model": "gpt"}, reg).messages[0]["content"] == "short"
    assert render(compiled, {"history": [1], "model": "llama3"}, reg).messages[0]["content"] == "short"


# -- slots -------------------------------------------------------------------------------------


def test_slots_fill_in_priority_order_but_appear_in_layout_order() -> None:
    """Fill order (priority) decides who gets the budget; layout order decides placement."""
    slots = {
        "late": slot(msg("L" * 8), priority=1),
        "early": slot(msg("E" * 8, role="assistant"), priority=0),
    }
    r = run(slots, budget=2, layout=[{"kind": "slot", "name": "late"}, {"kind": "slot", "name": "early"}])
    assert r.messages == [{"role": "assistant", "content": "E" * 8}]


def test_priority_ties_keep_declaration_order() -> None:
    """Equal priorities run in declaration order, integer-like names included."""
    order: list[str] = []
    slots = {name: slot(msg(**{"from": {"source": name}}), priority=1) for name in ("b", "10", "2", "a")}

    def recorder(name: str) -> Any:
        return lambda ctx, args: order.append(name)

    run(slots, handlers={n: recorder(n) for n in ("b", "10", "2", "a")})
    assert order == ["b", "10", "2", "a"]


def test_slot_condition_is_evaluated_on_its_turn() -> None:
    """A slot's when runs after higher-priority slots have run."""
    calls: list[str] = []
    slots = {
        "second": slot(msg("2"), priority=1, when={"type": "exists", "ref": {"source": "check"}}),
        "first": slot(msg(**{"from": {"source": "fill"}}), priority=0),
    }
    run(
        slots,
        handlers={
            "check": lambda c, a: calls.append("check") or 1,
            "fill": lambda c, a: calls.append("fill") or "x",
        },
    )
    assert calls == ["fill", "check"]


def test_false_slot_condition_gives_empty_buffer() -> None:
    """A slot whose when is false contributes nothing."""
    r = run(
        {"s": slot(msg("x"), when={"type": "nonEmpty", "ref": {"source": "xs"}})}, handlers={"xs": src([])}
    )
    assert r.messages == []


def test_slot_budgets_are_isolated() -> None:
    """Each slot's budget starts fresh; both draw on the global budget."""
    slots = {
        "a": slot(msg("a" * 8), budget={"maxTokens": 2}),
        "b": slot(msg("b" * 8, role="assistant"), budget={"maxTokens": 2}, priority=1),
    }
    assert contents(run(slots)) == ["a" * 8, "b" * 8]


def test_unused_slot_still_runs_and_spends_budget() -> None:
    """A slot missing from the layout still runs first and uses budget."""
    slots = {"hidden": slot(msg("h" * 8)), "shown": slot(msg("s" * 8), priority=1)}
    r = run(slots, budget=3, layout=[{"kind": "slot", "name": "shown"}])
    assert r.messages == []
    r = run(slots, budget=4, layout=[{"kind": "slot", "name": "shown"}])
    assert contents(r) == ["s" * 8]


# -- errors, limits, trace ---------------------------------------------------------------------


def test_unexpected_exception_becomes_render_error() -> None:
    """An exception outside resolvers (here: the estimator) is wrapped in RenderError."""
    compiled = compile_template(tpl({"s": slot(msg("x"))}))

    def broken(text: str) -> int:
        raise ValueError("estimator down")

    with pytest.raises(RenderError, match="Unexpected error during template rendering: estimator down"):
        render(compiled, {}, SourceRegistry(), budget=10, estimator=broken)


def test_storyforge_errors_pass_through_unchanged() -> None:
    """The engine's own errors (a render limit) are raised as they are."""
    compiled = compile_template(tpl({"s": slot(msg("{{big}}{{big}}"))}))
    with pytest.raises(RenderLimitError):
        render(compiled, {"big": "x" * 700_000}, SourceRegistry())


def test_context_must_be_a_mapping() -> None:
    """A non-mapping context is a RenderError naming the type."""
    compiled = compile_template(tpl({"s": slot(msg("x"))}))
    with pytest.raises(RenderError, match="mapping, got list"):
        render(compiled, [], SourceRegistry())  # type: ignore[arg-type]


def test_plain_mapping_registry_is_accepted() -> None:
    """A plain dict of handlers works as a registry; None means no sources."""
    compiled = compile_template(tpl({"s": slot(msg(**{"from": {"source": "x"}}))}))
    assert render(compiled, {}, {"x": src("v")}).messages == [{"role": "user", "content": "v"}]
    assert render(compiled, {}, None).messages == []


TRACE_SLOTS = {
    "cond": slot(msg("never"), when={"type": "exists", "ref": {"source": "none"}}),
    "main": slot(
        msg("{{nothing}}"),
        msg(**{"from": {"source": "bad"}}),
        loop("text", msg("{{item}}")),
        msg("x" * 40),
        msg("fits"),
        priority=1,
    ),
    "late": slot(msg("more"), priority=2),
}


def test_trace_records_every_reason() -> None:
    """The trace names each skipped node with its reason, and totals per slot."""
    r = run(TRACE_SLOTS, handlers={"bad": lambda c, a: 1 / 0, "text": src("not a list")}, budget=1)
    reasons = {(str(e.path), e.reason) for e in r.trace.skipped}
    assert {
        ("slots.cond", "condition_false"),
        ("slots.main.plan[0]", "empty"),
        ("slots.main.plan[1]", "resolver_error"),
        ("slots.main.plan[2]", "not_a_list"),
        ("slots.main.plan[3]", "over_budget"),
        ("slots.late.plan[0]", "out_of_budget"),
    } <= reasons
    by_name = {s.name: s for s in r.trace.slots}
    assert by_name["cond"].reason == "condition_false"
    assert by_name["main"].messages == 1 and by_name["main"].tokens == 1
    assert by_name["late"].status == "skipped"


def test_trace_to_dict_is_json_and_format_is_text() -> None:
    """to_dict() survives json.dumps; format() names slots, nodes and reasons."""
    r = run(TRACE_SLOTS, handlers={"bad": lambda c, a: 1 / 0, "text": src("x")}, budget=1)
    data = json.loads(json.dumps(r.trace.to_dict()))
    assert data["budget"] == {"max_tokens": 1, "consumed": 1}
    assert [s["name"] for s in data["slots"]] == ["cond", "main", "late"]
    text = r.trace.format()
    assert "cond (priority 0): skipped: condition_false" in text
    assert "slots.main.plan[3]: skipped: over_budget" in text


def test_trace_loop_indices() -> None:
    """Events inside loops carry the item indices of their frames."""
    r = run(
        {"s": slot(loop("xs", loop({"source": "$item"}, msg("{{item}}"))))},
        handlers={"xs": src([["a", "b"]])},
    )
    loops = [e.loop for e in r.trace.events if e.kind == "message"]
    assert loops == [(0, 0), (0, 1)]


def test_loop_items_of_every_shape_render_like_the_leaf() -> None:
    """Items needing the full leaf rules (floats, mappings, expansion, booleans) render correctly in loops."""
    items = ["a", 5, 2.5, None, {"k": 1}, "{{name}}", True, "  "]
    r = run({"s": slot(loop("xs", msg("[{{item}}]", role="assistant")))}, {"name": "Ada"}, {"xs": src(items)})
    assert r.messages[0]["content"].split("\n") == [
        "[a]",
        "[5]",
        "[2.5]",
        "[]",
        '[{"k":1}]',
        "[Ada]",
        "[true]",
        "[  ]",
    ]
    assert [e.loop for e in r.trace.events if e.kind == "message"] == [(i,) for i in range(8)]


def test_loop_item_keys_fall_back_to_scope_rules() -> None:
    """{{item.key}} with a missing key falls back to the globals, as the leaf rules say."""
    r = run(
        {"s": slot(loop("xs", msg("{{item.title}}")))},
        {"globals": {"item": {"title": "G"}}},
        {"xs": src([{"title": "T"}, {}, {"title": None}])},
    )
    assert contents(r) == ["T\nG"]
