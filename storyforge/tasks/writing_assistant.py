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

from storyforge.engine.sources import POSITIVE_INT, ArgRule, ContextSource, SourceTable, read_list
from storyforge.tasks.base import register_table_kind
from storyforge.tasks.turn_generation import ModelInfo

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


def _notes(ctx: Mapping[str, Any], _args: Mapping[str, Any]) -> list[Any]:
    notes = _style("notes", ctx)
    if notes is None:
        return []
    if not isinstance(notes, list | tuple):
        raise TypeError(f"context field 'stylePrefs.notes' must be a list, got {type(notes).__name__}")
    return list(notes)


SOURCE_TABLE = SourceTable(
    ContextSource(name="userText", returns="str", description="What the author asked for."),
    ContextSource(
        name="context",
        returns="list[str]",
        rules=EXCERPT_RULES,
        select=read_list("context", select_excerpt),
        description="The document excerpt as paragraphs in document order; limit keeps the last ones.",
    ),
    ContextSource(name="stylePrefs", returns="StylePrefs | None", description="All style preferences."),
    ContextSource(
        name="styleGuide",
        returns="str | None",
        select=lambda ctx, _args: _style("styleGuide", ctx),
        description="The style guide text.",
    ),
    ContextSource(
        name="tone",
        returns="str | None",
        select=lambda ctx, _args: _style("tone", ctx),
        description="The tone to write in.",
    ),
    ContextSource(
        name="styleNotes", returns="list[str]", select=_notes, description="Loose style notes ([] when none)."
    ),
    ContextSource(name="globals", returns="mapping | None", description="Document-wide scalars."),
)
make_registry = SOURCE_TABLE.registry_for
"""The registry for a writing-assistant context (handlers read the ctx they are given)."""


TASK = register_table_kind(
    "writing_assistant",
    WritingAssistantContext,
    SOURCE_TABLE,
    "Rewrite, continue or critique a passage following the author's style.",
)
