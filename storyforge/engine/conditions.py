"""Structured JSON conditions -> the expression AST shared with string conditions.

Takes: a condition mapping as written in a template (§2.7), for example
``{"type": "eq", "ref": {"source": "mode", "args": {...}}, "value": "chat"}``. Gives:
:func:`build_condition` -> ``(issues, expr)`` where ``expr`` is built from the same node types
the string grammar produces:

==========  ==========================================
``exists``     ``Call("exists", (Ref,))``
``nonEmpty``   ``Call("nonEmpty", (Ref,))``
``eq``         ``Compare("==", Ref, Literal(value))``
``neq``        ``Compare("!=", Ref, Literal(value))``
``gt``         ``Compare(">", Ref, Literal(value))``
``lt``         ``Compare("<", Ref, Literal(value))``
==========  ==========================================

Why it exists: one interpreter, one linter view (``Condition.refs()``) and one trace format
for both condition styles. ``args`` and ``value`` are deep-copied into frozen values, so the
caller's mapping stays mutable and isolated (decision #5). A missing ``value`` is
:data:`~storyforge.engine.sources.MISSING` (JavaScript's ``undefined``), which is not ``None``
(decisions #19 and #20). Unknown keys are ignored, as in the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storyforge.engine import nodes as n
from storyforge.engine.errors import Issue, TemplatePath, did_you_mean
from storyforge.engine.nodes import freeze
from storyforge.engine.sources import MISSING

__all__ = ["CONDITION_TYPES", "build_condition"]

CONDITION_TYPES = ("exists", "nonEmpty", "eq", "neq", "gt", "lt")

_COMPARISONS = {"eq": "==", "neq": "!=", "gt": ">", "lt": "<"}


def _issue(path: tuple[str, ...], message: str) -> Issue:
    return Issue(code="schema", path=TemplatePath(path), message=message)


def build_condition(spec: Mapping[str, Any]) -> tuple[list[Issue], n.Expr | None]:
    """The AST of a structured condition, or the issues that prevent building it."""
    issues: list[Issue] = []
    kind = spec.get("type")
    if kind not in CONDITION_TYPES:
        known = ", ".join(f"'{t}'" for t in CONDITION_TYPES)
        hint = did_you_mean(kind, CONDITION_TYPES, show="'{}'".format) if isinstance(kind, str) else ""
        got = f"'{kind}'" if isinstance(kind, str) else "nothing" if kind is None else type(kind).__name__
        issues.append(_issue(("type",), f"unknown condition type {got}.{hint} Expected one of {known}"))
    ref = spec.get("ref")
    source = ref.get("source") if isinstance(ref, Mapping) else None
    if not isinstance(ref, Mapping):
        issues.append(_issue(("ref",), 'a condition needs "ref": {"source": "<name>", "args"?: …}'))
    elif not isinstance(source, str):  # "" is a name like any other, as in `from` and `forEach`
        issues.append(_issue(("ref", "source"), 'a DataRef needs a string "source"'))
    if issues:
        return issues, None
    assert isinstance(ref, Mapping) and isinstance(source, str)
    node = n.Ref(source=source, args=freeze(ref.get("args")))
    if kind in ("exists", "nonEmpty"):
        return [], n.Call(name=str(kind), args=(node,))
    value = freeze(spec["value"]) if "value" in spec else MISSING  # undefined, not null (#20)
    return [], n.Compare(op=_COMPARISONS[str(kind)], left=node, right=n.Literal(value=value))
