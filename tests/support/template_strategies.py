"""Hypothesis strategies for whole templates, and the registry and contexts they render with.

Random templates over every plan and layout feature (messages with content, ``from``, prefix
and skip-if-empty; forEach with order, fill direction, limit, separators, budgets; if/else
with structured conditions; slot conditions and budgets; headers, footers, omitIfEmpty),
over a registry whose sources give lists, mappings, scalars, ``None`` and an exception.
``templates(budgets=NO_BUDGETS)`` draws templates that set no ``maxTokens`` anywhere. The
property tests (through ``tests/template_strategies.py``) and ``bench/render_corpus.py`` use them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st

from storyforge import SourceRegistry

__all__ = ["BUDGETS", "CONTEXTS", "NO_BUDGETS", "REGISTRY", "places", "plan_nodes", "templates"]


ROLES = st.sampled_from(["system", "user", "assistant"])
CONTENTS = st.sampled_from(
    [
        "{{item}}",
        "{{item.name}}: {{item.text}}",
        "Hello {{name}}",
        "static text",
        "x" * 30,
        "",
        "{{missing}}",
        "[{{item}}] {{ctx.name}}",
        "{{ name | upper }}",
        "{{#if item}}has {{item}}{{else}}none{{/if}}",
    ]
)
SOURCES = st.sampled_from(["xs", "objs", "text", "num", "none", "bad", "$item", "$index", "$ctx"])
LIST_SOURCES = st.sampled_from(["xs", "objs", "text", "none", "bad", "$item"])
BUDGETS = st.one_of(st.none(), st.fixed_dictionaries({}, optional={"maxTokens": st.integers(1, 40)}))
LOOP_BUDGETS = st.fixed_dictionaries({"maxTokens": st.integers(1, 40)})
NO_BUDGETS: st.SearchStrategy[dict[str, Any] | None] = st.one_of(st.none(), st.just({}))
"""Budgets that set no ceiling (``{}`` or none at all)."""


@cache  # built once per argument: building strategies is most of the cost of drawing
def message_nodes(role: Any = ROLES, budgets: Any = BUDGETS) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        node: dict[str, Any] = {"kind": "message", "role": draw(role)}
        if draw(st.booleans()):
            node["content"] = draw(CONTENTS)
        if draw(st.integers(0, 3)) == 0:
            node["from"] = {"source": draw(SOURCES)}
        if node["role"] == "assistant" and draw(st.booleans()):
            node["prefix"] = True
        if draw(st.booleans()):
            node["skipIfEmptyInterpolation"] = True
        budget = draw(budgets)
        if budget is not None:
            node["budget"] = budget
        return node

    return build()


CONDITIONS = st.one_of(
    st.builds(
        lambda t, s: {"type": t, "ref": {"source": s}}, st.sampled_from(["exists", "nonEmpty"]), SOURCES
    ),
    st.builds(
        lambda t, s, v: {"type": t, "ref": {"source": s}, "value": v},
        st.sampled_from(["eq", "neq", "gt", "lt"]),
        SOURCES,
        st.sampled_from([0, 3, "x", None, [], 2.5]),
    ),
)


@cache
def plan_nodes(budgets: Any = BUDGETS) -> st.SearchStrategy[list[dict[str, Any]]]:
    def extend(inner: st.SearchStrategy[list[dict[str, Any]]]) -> st.SearchStrategy[list[dict[str, Any]]]:
        @st.composite
        def loop(draw: st.DrawFn) -> dict[str, Any]:
            node: dict[str, Any] = {
                "kind": "forEach",
                "source": {"source": draw(LIST_SOURCES)},
                "map": draw(inner),
            }
            for key, strategy in (
                ("order", st.sampled_from(["asc", "desc"])),
                ("fillDir", st.sampled_from(["append", "prepend"])),
                ("limit", st.integers(1, 4)),
                (
                    "interleave",
                    st.builds(
                        lambda t: {"kind": "separator", "text": t}, st.sampled_from(["--", "~{{item}}~", ""])
                    ),
                ),
                (
                    "budget",
                    budgets.filter(lambda b: b is not None) if budgets is NO_BUDGETS else LOOP_BUDGETS,
                ),
                ("stopWhenOutOfBudget", st.booleans()),
            ):
                if draw(st.booleans()):
                    node[key] = draw(strategy)
            return node

        branch = st.builds(
            lambda w, t, e: {"kind": "if", "when": w, "then": t, "else": e}, CONDITIONS, inner, inner
        )
        return st.lists(st.one_of(message_nodes(budgets=budgets), loop(), branch), max_size=3)

    return st.recursive(st.lists(message_nodes(budgets=budgets), max_size=3), extend, max_leaves=8)


@st.composite
def templates(draw: st.DrawFn, budgets: Any = BUDGETS) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "2", "10"]), min_size=1, max_size=3, unique=True))
    slots: dict[str, Any] = {}
    for name in names:
        spec: dict[str, Any] = {"priority": draw(st.integers(0, 3)), "plan": draw(plan_nodes(budgets))}
        if draw(st.integers(0, 3)) == 0:
            spec["when"] = draw(CONDITIONS)
        budget = draw(budgets)
        if budget is not None:
            spec["budget"] = budget
        slots[name] = spec
    layout: list[Any] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            layout.append(draw(message_nodes(budgets=budgets)))
        else:
            node: dict[str, Any] = {"kind": "slot", "name": draw(st.sampled_from(names))}
            if draw(st.booleans()):
                node["header"] = {"role": draw(ROLES), "content": draw(CONTENTS)}
            if draw(st.booleans()):
                node["footer"] = [{"role": "user", "content": draw(CONTENTS)}]
            if draw(st.booleans()):
                node["omitIfEmpty"] = draw(st.booleans())
            layout.append(node)
    return {"id": "p", "name": "Property", "task": "prop", "version": 1, "layout": layout, "slots": slots}


def _bad(ctx: Any, args: Any) -> Any:
    raise ValueError("source failed")


REGISTRY = SourceRegistry(
    {
        "xs": lambda ctx, args: ctx.get("xs"),
        "objs": lambda ctx, args: [{"name": "n", "text": "t" * 9}, {"name": "m", "text": "u"}],
        "text": lambda ctx, args: "a text value",
        "num": lambda ctx, args: 3,
        "none": lambda ctx, args: None,
        "bad": _bad,
    }
)

CONTEXTS = st.fixed_dictionaries(
    {
        "xs": st.lists(st.text(max_size=30), max_size=6),
        "name": st.text(max_size=10),
    }
)


def places(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document, as the keys and indices leading to it (``()`` is the whole
    document), for tests that edit generated templates at random."""
    found = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(places(value, (*here, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(places(value, (*here, i)))
    return found
