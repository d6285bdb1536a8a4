"""Hypothesis properties of the engine: budgets hold, renders are deterministic, compiled
templates are immutable, and any input either compiles or raises TemplateValidationError."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import json_values, leaf_texts

from storyforge import CompiledTemplate, SourceRegistry, TemplateValidationError, compile_template, render
from storyforge.engine.budget import default_estimator

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

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


def message_nodes(role: Any = ROLES) -> st.SearchStrategy[dict[str, Any]]:
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
        budget = draw(BUDGETS)
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


def plan_nodes() -> st.SearchStrategy[list[dict[str, Any]]]:
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
                ("budget", st.fixed_dictionaries({"maxTokens": st.integers(1, 40)})),
                ("stopWhenOutOfBudget", st.booleans()),
            ):
                if draw(st.booleans()):
                    node[key] = draw(strategy)
            return node

        branch = st.builds(
            lambda w, t, e: {"kind": "if", "when": w, "then": t, "else": e}, CONDITIONS, inner, inner
        )
        return st.lists(st.one_of(message_nodes(), loop(), branch), max_size=3)

    return st.recursive(st.lists(message_nodes(), max_size=3), extend, max_leaves=8)


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "2", "10"]), min_size=1, max_size=3, unique=True))
    slots: dict[str, Any] = {}
    for name in names:
        spec: dict[str, Any] = {"priority": draw(st.integers(0, 3)), "plan": draw(plan_nodes())}
        if draw(st.integers(0, 3)) == 0:
            spec["when"] = draw(CONDITIONS)
        budget = draw(BUDGETS)
        if budget is not None:
            spec["budget"] = budget
        slots[name] = spec
    layout: list[Any] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            layout.append(draw(message_nodes()))
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


@SETTINGS
@given(template=templates(), ctx=CONTEXTS, budget=st.one_of(st.none(), st.integers(0, 120)))
def test_render_never_exceeds_budgets(
    template: dict[str, Any], ctx: dict[str, Any], budget: int | None
) -> None:
    """Emitted message costs (before squashing) stay within the global and every slot budget."""
    compiled = compile_template(template)
    result = render(compiled, ctx, REGISTRY, budget=budget)
    emitted = [e for e in result.trace.events if e.status == "rendered"]
    assert all(e.tokens == default_estimator(e_text) for e, e_text in _with_text(result))
    total = sum(e.tokens for e in emitted)
    if budget is not None:
        assert total <= budget
        assert result.trace.consumed == total
    for slot in result.trace.slots:
        limit = (template["slots"][slot.name].get("budget") or {}).get("maxTokens")
        if limit is not None:
            assert slot.tokens <= limit
    assert all(
        set(m) <= {"role", "content", "prefix"} and m.get("prefix", True) is True for m in result.messages
    )


def _with_text(result: Any) -> list[tuple[Any, str]]:
    texts = [raw[4] for raw in result.trace.raw]
    return [(e, t) for e, t in zip(result.trace.events, texts, strict=True) if e.status == "rendered"]


@SETTINGS
@given(template=templates(), ctx=CONTEXTS, budget=st.one_of(st.none(), st.integers(0, 120)))
def test_same_input_same_output(template: dict[str, Any], ctx: dict[str, Any], budget: int | None) -> None:
    """Rendering twice, even from separately compiled copies, gives identical results."""
    first = render(compile_template(template), ctx, REGISTRY, budget=budget)
    second = render(compile_template(copy.deepcopy(template)), copy.deepcopy(ctx), REGISTRY, budget=budget)
    assert first.messages == second.messages
    assert first.warnings == second.warnings
    assert first.trace.to_dict() == second.trace.to_dict()


def _assert_frozen(value: Any, seen: set[int]) -> None:
    if id(value) in seen or value is None or isinstance(value, str | int | float | bool):
        return
    seen.add(id(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            try:
                setattr(value, f.name, None)
            except (dataclasses.FrozenInstanceError, AttributeError, TypeError):
                pass
            else:
                raise AssertionError(f"{type(value).__name__}.{f.name} could be assigned")
            if f.name not in ("leaf", "condition", "program"):
                _assert_frozen(getattr(value, f.name), seen)
    elif isinstance(value, Mapping):
        try:
            value["__new__"] = 1  # type: ignore[index]
        except TypeError:
            pass
        else:
            raise AssertionError("a mapping in the compiled template accepted a new key")
        for item in value.values():
            _assert_frozen(item, seen)
    elif isinstance(value, tuple):
        for item in value:
            _assert_frozen(item, seen)
    else:
        raise AssertionError(f"unexpected mutable value {type(value).__name__} in a compiled template")


@SETTINGS
@given(template=templates())
def test_compiled_templates_cannot_be_mutated(template: dict[str, Any]) -> None:
    """Every dataclass, mapping and sequence reachable from a compiled template is read-only."""
    compiled = compile_template(template)
    assert isinstance(compiled, CompiledTemplate)
    _assert_frozen(compiled, set())


def _corrupt(template: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """Replace one randomly chosen value anywhere in the document by arbitrary JSON."""
    doc = copy.deepcopy(template)
    spots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in node:
                spots.append((node, key))
                walk(node[key])
        elif isinstance(node, list):
            for i in range(len(node)):
                spots.append((node, i))
                walk(node[i])

    walk(doc)
    parent, key = data.draw(st.sampled_from(spots))
    parent[key] = data.draw(st.one_of(json_values(4), leaf_texts()))
    return doc


@SETTINGS
@given(template=templates(), data=st.data())
def test_any_document_compiles_or_raises_validation_error(
    template: dict[str, Any], data: st.DataObject
) -> None:
    """A corrupted template either compiles or raises TemplateValidationError, never anything else."""
    doc = _corrupt(template, data)
    try:
        compiled = compile_template(doc)
    except TemplateValidationError as exc:
        assert exc.issues and all(str(i.path) and i.message for i in exc.issues)
    else:
        render(compiled, {"xs": ["a"], "name": "n"}, REGISTRY, budget=50)


@SETTINGS
@given(value=json_values(10))
def test_arbitrary_json_compiles_or_raises_validation_error(value: Any) -> None:
    """Arbitrary JSON values are rejected with TemplateValidationError."""
    try:
        compile_template(value)
    except TemplateValidationError:
        pass


SIMPLE_LEAVES = st.lists(
    st.sampled_from(
        ["{{item}}", "{{item.name}}", "{{item.n}}", "{{name}}", "{{n}}", " - ", ": ", "", "\n", "é"]
    ),
    min_size=1,
    max_size=6,
).map("".join)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["{{n}}", " {{item}} ", "\ufeff", "  "]),
    json_values(3),
)


@SETTINGS
@given(
    text=SIMPLE_LEAVES,
    item=st.one_of(VALUES, st.dictionaries(st.sampled_from(["name", "n"]), VALUES)),
    ctx=st.dictionaries(st.sampled_from(["name", "n", "item", "globals"]), VALUES),
)
def test_simple_leaf_shortcut_matches_the_compiled_leaf(text: str, item: Any, ctx: dict[str, Any]) -> None:
    """The renderer's shortcut for simple leaves gives exactly the compiled leaf's output, or defers."""
    from storyforge.engine.assembler import simple_leaf
    from storyforge.engine.parser import compile_leaf
    from storyforge.engine.runtime import Scope

    leaf = compile_leaf(text)
    quick = simple_leaf(leaf)
    assert (quick is None) == (not leaf.has_variables)  # every hole here has a simple shape
    if quick is None:
        return
    got = quick(item, ctx)
    if got is not None:
        assert got == leaf.render(Scope(ctx, item, ()))
