"""The ``writing_assistant`` task kind: help an author with a passage of their document.

Takes: a :class:`WritingAssistantContext` (the user's request, the document excerpt as a list
of paragraphs, style preferences, globals, and the runner's ``model``). Gives: the registered
:data:`TASK` whose sources are ``userText``, ``context``, ``stylePrefs``, ``styleGuide``,
``tone``, ``styleNotes`` and ``globals`` (the first six are the original StoryForge names).

Why: an editing prompt needs the request, the nearby text and the author's style rules; the
excerpt source can keep only the paragraphs closest to the cursor, so long documents fit a
budget without the template slicing data itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from storyforge.sources import SourceRegistry, SourceSpec
from storyforge.tasks.base import TaskKind, register_task_kind
from storyforge.tasks.turn_generation import (
    POSITIVE_INT,
    ArgRule,
    ModelInfo,
    checked_handler,
    checker,
    context_list,
    spec_args,
)

__all__ = ["TASK", "StylePrefs", "WritingAssistantContext", "make_registry", "select_excerpt"]


class StylePrefs(TypedDict, total=False):
    """The author's style rules: a guide, a tone, and loose notes."""

    styleGuide: str
    tone: str
    notes: list[str]


class WritingAssistantContext(TypedDict):
    """Everything a writing-assistant render may read."""

    userText: str
    context: list[str]
    stylePrefs: NotRequired[StylePrefs]
    globals: NotRequired[dict[str, Any]]
    model: NotRequired[ModelInfo]


EXCERPT_RULES: Mapping[str, ArgRule] = {"limit": POSITIVE_INT}

RULES: Mapping[str, Mapping[str, ArgRule]] = {
    "userText": {},
    "context": EXCERPT_RULES,
    "stylePrefs": {},
    "styleGuide": {},
    "tone": {},
    "styleNotes": {},
    "globals": {},
}


def select_excerpt(paragraphs: list[Any], args: Mapping[str, Any]) -> list[Any]:
    """The excerpt in document order; ``limit`` keeps the last paragraphs (nearest the cursor)."""
    if "limit" in args:
        return paragraphs[-args["limit"] :]
    return paragraphs


def _style(key: str, ctx: Mapping[str, Any]) -> Any:
    prefs = ctx.get("stylePrefs")
    if prefs is None:
        return None
    if not isinstance(prefs, Mapping):
        raise TypeError(f"context field 'stylePrefs' must be a mapping, got {type(prefs).__name__}")
    return prefs.get(key)


def _notes(ctx: Mapping[str, Any]) -> list[Any]:
    notes = _style("notes", ctx)
    if notes is None:
        return []
    if not isinstance(notes, list | tuple):
        raise TypeError(f"context field 'stylePrefs.notes' must be a list, got {type(notes).__name__}")
    return list(notes)


SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec(name="userText", returns="str", description="What the author asked for."),
    SourceSpec(
        name="context",
        returns="list[str]",
        args=spec_args(EXCERPT_RULES),
        description="The document excerpt as paragraphs in document order; limit keeps the last ones.",
    ),
    SourceSpec(name="stylePrefs", returns="StylePrefs | None", description="All style preferences."),
    SourceSpec(name="styleGuide", returns="str | None", description="The style guide text."),
    SourceSpec(name="tone", returns="str | None", description="The tone to write in."),
    SourceSpec(name="styleNotes", returns="list[str]", description="Loose style notes ([] when none)."),
    SourceSpec(name="globals", returns="mapping | None", description="Document-wide scalars."),
)

_REGISTRY = SourceRegistry(
    {
        "userText": checked_handler("userText", {}, lambda ctx, _args: ctx.get("userText")),
        "context": checked_handler(
            "context", EXCERPT_RULES, lambda ctx, args: select_excerpt(context_list(ctx, "context"), args)
        ),
        "stylePrefs": checked_handler("stylePrefs", {}, lambda ctx, _args: ctx.get("stylePrefs")),
        "styleGuide": checked_handler("styleGuide", {}, lambda ctx, _args: _style("styleGuide", ctx)),
        "tone": checked_handler("tone", {}, lambda ctx, _args: _style("tone", ctx)),
        "styleNotes": checked_handler("styleNotes", {}, lambda ctx, _args: _notes(ctx)),
        "globals": checked_handler("globals", {}, lambda ctx, _args: ctx.get("globals")),
    }
)


def make_registry(ctx: Mapping[str, Any]) -> SourceRegistry:
    """The registry for a writing-assistant context (handlers read the ctx they are given)."""
    return _REGISTRY


TASK = register_task_kind(
    TaskKind(
        name="writing_assistant",
        context_type=WritingAssistantContext,
        sources=SOURCES,
        registry_factory=make_registry,
        description="Rewrite, continue or critique a passage following the author's style.",
        check_args=checker(RULES),
    )
)
