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

from storyforge import CompiledTemplate, TemplateValidationError, compile_template, render
from storyforge.engine.budget import default_estimator
from tests.support.template_strategies import CONTEXTS, REGISTRY, templates

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
    if id(value) in seen or value is None or isinstance(value, str | int | float | bool | bytes):
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
