"""Tiered compilation: a template renders through its closures until it is hot, then through
its generated program, with the same output all along (storyforge.engine.compiler.HOT_AFTER).

The closures and the programs are compared on random templates in tests/test_plangen.py
(``compile_as`` forces either tier); here the switch itself is checked.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from template_strategies import CONTEXTS, REGISTRY, compile_as, templates

from storyforge import compile_template, render
from storyforge.engine import compiler
from storyforge.engine.compiler import clear_cache
from storyforge.engine.errors import TemplateValidationError
from storyforge.engine.renderer import _PENDING

DOC: dict[str, Any] = {
    "id": "t",
    "name": "t",
    "task": "x",
    "version": 1,
    "layout": [{"kind": "slot", "name": "s"}],
    "slots": {
        "s": {
            "priority": 0,
            "plan": [
                {
                    "kind": "forEach",
                    "source": {"source": "$ctx", "args": {"path": "xs"}},
                    "map": [{"kind": "message", "role": "user", "content": "- {{item}}"}],
                }
            ],
        }
    },
}


@pytest.fixture
def hot_after(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(compiler, "HOT_AFTER", 3)
    clear_cache()
    yield 3
    clear_cache()


@pytest.mark.parametrize("budget", [None, 50], ids=["no budget", "budget"])
def test_program_is_built_at_the_render_after_hot_after(hot_after: int, budget: int | None) -> None:
    compiled = compile_template(DOC)
    generated = compiled.program.generated
    assert generated is not None
    attribute = "unbudgeted" if budget is None else "budgeted"
    other = "budgeted" if budget is None else "unbudgeted"
    outputs = []
    for _ in range(hot_after):
        outputs.append(render(compiled, {"xs": ["a", "b"]}, budget=budget).messages)
        assert getattr(generated, attribute) is _PENDING  # still the closures
    outputs.append(render(compiled, {"xs": ["a", "b"]}, budget=budget).messages)
    assert getattr(generated, attribute) is not _PENDING  # hot: the program is built
    assert getattr(generated, other) is _PENDING  # each kind of render counts on its own
    outputs.append(render(compiled, {"xs": ["a", "b"]}, budget=budget).messages)
    assert outputs == [[{"role": "user", "content": "- a\n- b"}]] * (hot_after + 2)


def test_hot_after_zero_builds_at_the_first_render(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "HOT_AFTER", 0)
    clear_cache()
    compiled = compile_template(DOC)
    render(compiled, {"xs": ["a"]})
    assert compiled.program.generated is not None
    assert compiled.program.generated.unbudgeted is not _PENDING
    clear_cache()


def test_the_default_keeps_one_off_renders_on_the_closures() -> None:
    clear_cache()
    compiled = compile_template(DOC)
    render(compiled, {"xs": ["a"]})
    assert compiler.HOT_AFTER > 0
    assert compiled.program.generated is not None
    assert compiled.program.generated.unbudgeted is _PENDING
    clear_cache()


@settings(max_examples=60, deadline=None)
@given(template=templates(), ctx=CONTEXTS, budget=st.one_of(st.none(), st.integers(0, 200)))
def test_output_is_the_same_across_the_switch(
    template: dict[str, Any], ctx: dict[str, Any], budget: int | None
) -> None:
    """Every render before, at and after the switch equals the closures-only render."""
    expected = render(compile_as(template, False), ctx, REGISTRY, budget=budget)
    saved, compiler.HOT_AFTER = compiler.HOT_AFTER, 3
    try:
        clear_cache()
        compiled = compile_template(template)
    finally:
        compiler.HOT_AFTER = saved
        clear_cache()
    for _ in range(3 + 2):
        got = render(compiled, ctx, REGISTRY, budget=budget)
        assert (got.messages, got.warnings) == (expected.messages, expected.warnings)
    assert compiled.program.generated is not None
    built = (
        compiled.program.generated.budgeted if budget is not None else compiled.program.generated.unbudgeted
    )
    assert built is not _PENDING


def _cyclic_garbage(work: Any) -> list[str]:
    """What the cyclic collector alone would free after ``work()``: kept aside
    (``gc.DEBUG_SAVEALL``) with the collector paused while it runs, and described."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        work()
        gc.collect()
        found = [f"{type(o).__name__} {getattr(o, '__qualname__', '')}".strip() for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    return found


# each template reaches one way of building a program that once left a reference cycle behind:
# ``{{#if}}`` blocks and filters, a node's maxTokens, a condition string, a misspelt key (the schema's suggestion)
CYCLE_DOCS = [
    DOC,
    {
        **DOC,
        "slots": {
            "s": {
                "priority": 0,
                "when": "len(xs) > 1",
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "$ctx", "args": {"path": "xs"}},
                        "budget": {"maxTokens": 30},
                        "map": [
                            {"kind": "message", "role": "user", "content": "{{#if item}}has {{item}}{{/if}}"},
                            {
                                "kind": "if",
                                "when": {"type": "nonEmpty", "ref": {"source": "$item"}},
                                "then": [
                                    {"kind": "message", "role": "assistant", "content": "{{ item | upper }}"}
                                ],
                            },
                        ],
                    }
                ],
            }
        },
    },
    {**DOC, "descripton": "a misspelt key is a note, not an error"},
]


@pytest.mark.parametrize("doc", CYCLE_DOCS, ids=["forEach", "blocks and budget", "misspelt key"])
def test_a_template_dropped_after_going_hot_leaves_no_cyclic_garbage(
    hot_after: int, doc: dict[str, Any]
) -> None:
    """Compiling, rendering through both tiers (with and without a budget) and dropping a
    template is freed by reference counting alone: nothing is left for the cyclic collector,
    which would otherwise run (and take its time) inside the next compile or render."""

    def work() -> None:
        compiled = compile_template(doc)
        for _ in range(hot_after + 2):
            for budget in (None, 40):
                render(compiled, {"xs": ["a", "", "b"]}, budget=budget)
        generated = compiled.program.generated
        assert generated is not None
        assert generated.unbudgeted is not _PENDING and generated.budgeted is not _PENDING
        compiled.generated_source()
        assert [note.code for note in compiled.notes] == (["unknown_key"] if "descripton" in doc else [])
        clear_cache()
        with pytest.raises(TemplateValidationError):  # a template that fails to compile
            compile_template({**doc, "slots": {"s": {"priority": 0, "when": "len(", "plan": []}}})

    work()  # first: whatever is loaded once per process
    assert _cyclic_garbage(work) == []


LAZY_DOC: dict[str, Any] = {
    "id": "lazy",
    "name": "lazy",
    "task": "x",
    "version": 1,
    "layout": [
        {"kind": "slot", "name": "gated", "header": {"role": "system", "content": "gated:"}},
        {"kind": "slot", "name": "main", "header": {"role": "system", "content": "main:"}},
    ],
    "slots": {
        "gated": {
            "priority": 0,
            "when": {"type": "exists", "ref": {"source": "$ctx", "args": {"path": "on"}}},
            "plan": [{"kind": "message", "role": "user", "content": "on"}],
        },
        "main": {
            "priority": 1,
            "plan": [
                {
                    "kind": "if",
                    "when": {"type": "exists", "ref": {"source": "$ctx", "args": {"path": "on"}}},
                    "then": [{"kind": "message", "role": "user", "content": "then"}],
                    "else": [{"kind": "message", "role": "user", "content": "else"}],
                }
            ],
        },
    },
}


def test_closures_are_built_when_a_render_first_reaches_them() -> None:
    """Compiling builds no slot plan, branch or header closures; a render builds those it
    reaches, once, and a later render that reaches more builds the rest with the same output
    as a template compiled for it afresh."""
    clear_cache()
    compiled = compile_template(LAZY_DOC)
    gated, main = compiled.program.slots
    assert gated.built == [None] and main.built == [None]
    off = render(compiled, {}, REGISTRY)
    assert [m["content"] for m in off.messages] == ["main:", "else"]
    assert gated.built == [None]  # its condition failed: never built
    plan = main.built[0]
    assert plan is not None
    render(compiled, {}, REGISTRY)
    assert main.built[0] is plan  # built once, then reused
    on = render(compiled, {"on": 1}, REGISTRY)
    assert gated.built[0] is not None
    clear_cache()
    fresh = render(compile_template(LAZY_DOC), {"on": 1}, REGISTRY)
    assert on.messages == fresh.messages
    assert [m["content"] for m in on.messages] == ["gated:", "on", "main:", "then"]
    assert on.trace.to_dict() == fresh.trace.to_dict()
