"""What compiling and rendering leave behind: no cyclic garbage, and closures built only when
a render first reaches them."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from storyforge import compile_template, render
from storyforge.engine.compiler import clear_cache
from storyforge.engine.errors import TemplateValidationError
from tests.support.template_strategies import REGISTRY

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
def test_a_dropped_template_leaves_no_cyclic_garbage(doc: dict[str, Any]) -> None:
    """Compiling, rendering (with and without a budget) and dropping a template is freed by
    reference counting alone: nothing is left for the cyclic collector, which would otherwise
    run (and take its time) inside the next compile or render."""

    def work() -> None:
        compiled = compile_template(doc)
        for _ in range(3):
            for budget in (None, 40):
                render(compiled, {"xs": ["a", "", "b"]}, budget=budget)
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
