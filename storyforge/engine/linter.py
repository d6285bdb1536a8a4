"""Authoring checks beyond shape: task binding, source names and args, structure guards.

Takes: a normalised template document (which may still have schema problems: every walk here
is defensive and simply skips parts of the wrong shape), the expected task, the allowed
source names and optionally their :class:`~storyforge.engine.sources.SourceSpec`. Gives: lists of
:class:`~storyforge.engine.errors.Issue`, and :func:`collect` (every DataRef, leaf string,
condition and message block with its path), which the compiler also uses to find what to
parse. :func:`notes` lists non-fatal smells (a child budget above its parent's, a slot the
layout never shows, a misspelt key that will be ignored).

Why: the reference stops at the first failing stage; storyforge reports everything at once,
so each check must work on documents that are only partly valid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeGuard

from storyforge.engine.errors import Issue, TemplatePath, did_you_mean
from storyforge.engine.sources import RESERVED_SOURCES, SourceSpec

__all__ = [
    "RESERVED_ARGS",
    "Parts",
    "RefSite",
    "check_structure",
    "check_task",
    "collect",
    "lint_sources",
    "notes",
]

RESERVED_ARGS: Mapping[str, frozenset[str]] = {
    "$item": frozenset({"path"}),
    "$index": frozenset(),
    "$parent": frozenset({"level", "path"}),
    "$globals": frozenset({"path"}),
    "$ctx": frozenset({"path"}),
}
"""Arguments each reserved source understands (checked only when source specs are given)."""

_RESERVED_ORDER = ("$item", "$index", "$parent", "$globals", "$ctx")


@dataclass(frozen=True, slots=True, kw_only=True)
class RefSite:
    """One use of a source: where it is written, the name, and its args (if any)."""

    path: TemplatePath
    source: str
    args: Any = None
    has_args: bool = False


@dataclass(slots=True, kw_only=True)
class Parts:
    """Everything the compiler needs to find in a document, each with its path."""

    refs: list[RefSite] = field(default_factory=list)
    leaves: list[tuple[TemplatePath, str]] = field(default_factory=list)
    conditions: list[tuple[TemplatePath, Any]] = field(default_factory=list)
    blocks: list[tuple[TemplatePath, Mapping[str, Any]]] = field(default_factory=list)
    slot_refs: list[tuple[TemplatePath, str]] = field(default_factory=list)
    budgets: list[tuple[TemplatePath, int, int | None]] = field(default_factory=list)


# -- collection --------------------------------------------------------------------------------


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, answered at once for the plain dicts of a normalised document."""
    return value.__class__ is dict or isinstance(value, Mapping)


def collect(doc: Any) -> Parts:
    """Walk ``doc`` and gather refs, leaves, conditions, blocks and layout slot references."""
    parts = Parts()
    if not _is_map(doc):
        return parts
    root = TemplatePath()
    layout = doc.get("layout")
    if isinstance(layout, list):
        for i, node in enumerate(layout):
            if not _is_map(node):
                continue
            path = root.child("layout", i)
            kind = node.get("kind")
            if kind == "message":
                _block(node, path, parts)
            elif kind == "slot":
                name = node.get("name")
                if isinstance(name, str):
                    parts.slot_refs.append((path / "name", name))
                for key in ("header", "footer"):
                    blocks = node.get(key)
                    if isinstance(blocks, list):
                        for j, b in enumerate(blocks):
                            if _is_map(b):
                                _block(b, path.child(key, j), parts)
                    elif _is_map(blocks):
                        _block(blocks, path / key, parts)
    slots = doc.get("slots")
    if _is_map(slots):
        for name, slot in slots.items():
            if not _is_map(slot):
                continue
            path = root.child("slots", name)
            if "when" in slot:
                _condition(slot["when"], path / "when", parts)
            limit = _max_tokens(slot.get("budget"))
            if limit is not None:
                parts.budgets.append((path / "budget", limit, None))
            _plan(slot.get("plan"), path / "plan", parts, limit)
    return parts


def _max_tokens(budget: Any) -> int | None:
    if _is_map(budget):
        value = budget.get("maxTokens")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _ref(raw: Any, path: TemplatePath, parts: Parts) -> None:
    if _is_map(raw) and isinstance(raw.get("source"), str):
        parts.refs.append(
            RefSite(path=path, source=raw["source"], args=raw.get("args"), has_args="args" in raw)
        )


def _block(node: Mapping[str, Any], path: TemplatePath, parts: Parts) -> None:
    parts.blocks.append((path, node))
    content = node.get("content")
    if content and isinstance(content, str):
        parts.leaves.append((path / "content", content))
    if "from" in node:
        _ref(node["from"], path / "from", parts)


def _condition(spec: Any, path: TemplatePath, parts: Parts) -> None:
    if spec.__class__ is str:
        parts.conditions.append((path, spec))
    elif _is_map(spec):
        parts.conditions.append((path, spec))
        _ref(spec.get("ref"), path / "ref", parts)
    elif isinstance(spec, str):
        parts.conditions.append((path, spec))


def _plan(nodes: Any, path: TemplatePath, parts: Parts, enclosing: int | None) -> None:
    if not isinstance(nodes, list):
        return
    for i, node in enumerate(nodes):
        if node.__class__ is not dict and not isinstance(node, Mapping):
            continue
        here = path / i
        kind = node.get("kind")
        own = _max_tokens(node["budget"]) if "budget" in node else None
        if own is not None and kind in ("message", "forEach"):
            parts.budgets.append((here / "budget", own, enclosing))
        if kind == "message":
            _block(node, here, parts)
        elif kind == "forEach":
            _ref(node.get("source"), here / "source", parts)
            inter = node.get("interleave")
            if _is_map(inter) and isinstance(inter.get("text"), str) and inter["text"]:
                parts.leaves.append((here.child("interleave", "text"), inter["text"]))
            inner = own if own is not None and (enclosing is None or own < enclosing) else enclosing
            _plan(node.get("map"), here / "map", parts, inner)
        elif kind == "if":
            if "when" in node:
                _condition(node["when"], here / "when", parts)
            _plan(node.get("then"), here / "then", parts, enclosing)
            _plan(node.get("else"), here / "else", parts, enclosing)


# -- checks ------------------------------------------------------------------------------------


def check_task(doc: Any, task: str | None) -> list[Issue]:
    """The template's ``task`` must equal ``task`` exactly (no check when ``task`` is None)."""
    if task is None or not isinstance(doc, Mapping):
        return []
    found = doc.get("task")
    if not isinstance(found, str) or found == task:
        return []  # a missing or non-string task is a schema issue
    return [
        Issue(
            code="task_mismatch",
            path=TemplatePath(("task",)),
            message=f'Task kind must be "{task}"; this template is for "{found}"',
        )
    ]


def lint_sources(
    refs: Iterable[RefSite],
    allowed_sources: Sequence[str] | None,
    source_specs: Sequence[SourceSpec] | None = None,
) -> list[Issue]:
    """Unknown source names (with suggestions) and, given specs, unknown argument names.

    ``allowed_sources=None`` turns name linting off; an empty list turns it on (only the
    reserved sources are then allowed).
    """
    issues: list[Issue] = []
    specs = {s.name: s for s in source_specs} if source_specs is not None else None
    allowed = list(allowed_sources) if allowed_sources is not None else None
    for site in refs:
        name = site.source
        if name in RESERVED_SOURCES:
            if specs is not None:
                issues.extend(_lint_args(site, RESERVED_ARGS[name]))
            continue
        if allowed is not None and name not in allowed:
            issues.append(_unknown_source(site, allowed))
            continue
        if specs is not None and name in specs:
            issues.extend(_lint_args(site, frozenset(specs[name].args)))
    return issues


def _unknown_source(site: RefSite, allowed: list[str]) -> Issue:
    candidates = [*allowed, *_RESERVED_ORDER]
    text = f"unknown source {site.source!r}.{did_you_mean(site.source, candidates)}"
    listed = ", ".join(allowed) if allowed else "none"
    text += f" Allowed: {listed} (plus the reserved {', '.join(_RESERVED_ORDER)})"
    return Issue(code="unknown_source", path=site.path, message=text)


def _lint_args(site: RefSite, accepted: frozenset[str]) -> list[Issue]:
    args = site.args
    if not site.has_args or args is None:
        return []
    if not isinstance(args, Mapping):
        if not accepted:
            return [
                Issue(
                    code="unknown_arg",
                    path=site.path / "args",
                    message=f"source {site.source!r} takes no arguments",
                )
            ]
        return [
            Issue(
                code="bad_args",
                path=site.path / "args",
                message=f"args of source {site.source!r} must be a mapping of "
                f"{', '.join(sorted(accepted))}; found a {type(args).__name__}",
            )
        ]
    issues: list[Issue] = []
    for key in args:
        if key in accepted:
            continue
        if not accepted:
            message = f"source {site.source!r} takes no arguments; found {key!r}"
        else:
            message = f"source {site.source!r} has no argument {key!r}.{did_you_mean(str(key), accepted)}"
            message += f" Accepted: {', '.join(sorted(accepted))}"
        issues.append(Issue(code="unknown_arg", path=site.path / "args" / key, message=message))
    return issues


def check_structure(doc: Any, parts: Parts) -> list[Issue]:
    """Layout slot references must exist; ``prefix: true`` only on assistant messages."""
    issues: list[Issue] = []
    slots = doc.get("slots") if isinstance(doc, Mapping) else None
    names = list(slots) if isinstance(slots, Mapping) else None
    if names is not None:
        for path, name in parts.slot_refs:
            if name in slots:  # type: ignore[operator]
                continue
            text = f'Layout references non-existent slot: "{name}".'
            text += did_you_mean(name, names, show='"{}"'.format)
            text += f" Slots: {', '.join(names) if names else 'none'}"
            issues.append(Issue(code="missing_slot", path=path, message=text))
    for path, block in parts.blocks:
        role = block.get("role")
        if block.get("prefix") is True and role != "assistant":
            shown = role if isinstance(role, str) else "non-assistant"
            issues.append(
                Issue(
                    code="prefix_role",
                    path=path / "prefix",
                    message=f"prefix: true is only allowed on assistant messages; "
                    f"this is a {shown!r} message",
                )
            )
    return issues


# -- smells ------------------------------------------------------------------------------------

_KNOWN_KEYS: dict[str, frozenset[str]] = {
    "template": frozenset({"id", "name", "task", "description", "version", "layout", "slots"}),
    "block": frozenset(
        {"kind", "name", "role", "content", "from", "prefix", "skipIfEmptyInterpolation", "budget"}
    ),
    "layout_slot": frozenset({"kind", "name", "header", "footer", "omitIfEmpty"}),
    "slot": frozenset({"priority", "when", "budget", "plan", "meta"}),
    "forEach": frozenset(
        {"kind", "source", "map", "order", "fillDir", "limit", "interleave", "budget", "stopWhenOutOfBudget"}
    ),
    "if": frozenset({"kind", "when", "then", "else"}),
}


def notes(doc: Any, parts: Parts) -> list[Issue]:
    """Non-fatal smells worth showing an author; rendering is unaffected."""
    out: list[Issue] = []
    if not _is_map(doc):
        return out
    for path, own, enclosing in parts.budgets:
        if enclosing is not None and own > enclosing:
            out.append(
                Issue(
                    code="budget_above_parent",
                    path=path / "maxTokens",
                    message=f"maxTokens {own} is above the enclosing budget of {enclosing}; "
                    "the enclosing one always wins",
                )
            )
    slots = doc.get("slots")
    if _is_map(slots):
        used = {name for _, name in parts.slot_refs}
        for name in slots:
            if name not in used:
                out.append(
                    Issue(
                        code="unused_slot",
                        path=TemplatePath(("slots", name)),
                        message=f"slot {name!r} is not in the layout: it still runs and uses budget",
                    )
                )
    out.extend(_misspelt_keys(doc))
    out.extend(_unclosed_placeholders(parts.leaves))
    return out


def _unclosed_placeholders(leaves: Iterable[tuple[TemplatePath, str]]) -> list[Issue]:
    """The first ``{{`` of a string with no ``}}`` before the next ``{{`` (or the end): read as
    plain text (as in the reference) or as part of the next placeholder, most likely a typo."""
    out: list[Issue] = []
    for path, text in leaves:
        start = text.find("{{")
        while start >= 0 and 0 <= text.find("}}", start + 2) < _next(text, start):
            start = text.find("{{", start + 2)
        if start >= 0:
            line, column = text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
            shown = text[start : start + 40].split("\n", 1)[0]
            message = f"{shown!r} is not closed with '}}}}' before the next '{{{{' or the end of the text"
            out.append(
                Issue(code="unclosed_placeholder", path=path, message=message, line=line, column=column)
            )
    return out


def _next(text: str, start: int) -> int:
    """Where the ``{{`` after the one at ``start`` is (the end of ``text`` when none is)."""
    following = text.find("{{", start + 2)
    return following if following >= 0 else len(text)


def _misspelt_keys(doc: Mapping[str, Any]) -> list[Issue]:
    out: list[Issue] = []
    check = partial(_check_keys, out)
    check(doc, "template", ())
    layout = doc.get("layout")
    if isinstance(layout, list):
        for i, node in enumerate(layout):
            if _is_map(node):
                check(node, "layout_slot" if node.get("kind") == "slot" else "block", ("layout", i))
    slots = doc.get("slots")
    if _is_map(slots):
        for name, slot in slots.items():
            check(slot, "slot", ("slots", name))
            if _is_map(slot):
                _plan_keys(check, slot.get("plan"), ("slots", name, "plan"))
    return out


# paths are plain tuples here, made a TemplatePath only for an issue (most documents have none)
def _check_keys(out: list[Issue], node: Any, kind: str, path: tuple[str | int, ...]) -> None:
    """Add to ``out`` a note for each key of ``node`` (a ``kind`` mapping at ``path``) that is
    not one of its kind's but close to one."""
    if not _is_map(node):
        return
    known = _KNOWN_KEYS[kind]
    if node.keys() <= known:  # the usual case, answered without a loop
        return
    for key in node:
        if key in known:
            continue
        hint = did_you_mean(key, known, cutoff=0.8)
        if hint:
            out.append(
                Issue(
                    code="unknown_key",
                    path=TemplatePath((*path, key)),
                    message=f"unknown key {key!r} is ignored.{hint}",
                )
            )


def _plan_keys(
    check: Callable[[Any, str, tuple[str | int, ...]], None], nodes: Any, path: tuple[str | int, ...]
) -> None:
    """``check`` every plan node of ``nodes``, nested ones too (a module function: a nested
    closure calling itself would be a reference cycle that only the cyclic collector frees)."""
    if not isinstance(nodes, list):
        return
    for i, node in enumerate(nodes):
        if not _is_map(node):
            continue
        kind = node.get("kind")
        here = (*path, i)
        if kind == "message":
            check(node, "block", here)
        elif kind == "forEach":
            check(node, "forEach", here)
            _plan_keys(check, node.get("map"), (*here, "map"))
        elif kind == "if":
            check(node, "if", here)
            _plan_keys(check, node.get("then"), (*here, "then"))
            _plan_keys(check, node.get("else"), (*here, "else"))
