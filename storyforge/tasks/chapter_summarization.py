"""The ``chapter_summarization`` task kind: summarise one finished chapter of a story.

Takes: a :class:`ChapterSummarizationContext` (the chapter's turns, summaries of the chapters
before it, the roster, the chapter being summarised, globals, and the runner's ``model``).
Gives: the registered :data:`TASK` whose sources are ``turns``, ``currentChapterTurns``,
``characters``, ``chapterSummaries``, ``target`` and ``globals``.

Why: a summary prompt needs the chapter in reading order and the earlier summaries for
continuity, and nothing else; the selectors and argument rules are the ones the
``turn_generation`` task kind uses, so a ``turns`` or ``chapterSummaries`` DataRef means the
same thing in both kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from storyforge.sources import SourceRegistry, SourceSpec
from storyforge.tasks.base import TaskKind, register_task_kind
from storyforge.tasks.turn_generation import (
    ORDER,
    POSITIVE_INT,
    STR_LIST,
    SUMMARY_RULES,
    TURN_RULES,
    ArgRule,
    ChapterSummary,
    Character,
    ModelInfo,
    Turn,
    checked_handler,
    checker,
    context_list,
    select_characters,
    select_summaries,
    select_turns,
    spec_args,
)

__all__ = [
    "TASK",
    "ChapterSummarizationContext",
    "ChapterSummarizationGlobals",
    "ChapterTarget",
    "make_registry",
]


class ChapterTarget(TypedDict):
    """The chapter being summarised."""

    chapterNumber: int
    title: NotRequired[str | None]
    turnCount: NotRequired[int]


class ChapterSummarizationGlobals(TypedDict, total=False):
    """Story-wide scalars; ``targetWords`` is the summary length the author asks for."""

    storyTitle: str
    setting: str
    targetWords: int


class ChapterSummarizationContext(TypedDict):
    """Everything a chapter-summary render may read."""

    turns: list[Turn]
    characters: NotRequired[list[Character]]
    chapterSummaries: NotRequired[list[ChapterSummary]]
    target: ChapterTarget
    globals: ChapterSummarizationGlobals
    model: NotRequired[ModelInfo]


CHARACTER_RULES: Mapping[str, ArgRule] = {"order": ORDER, "limit": POSITIVE_INT, "ids": STR_LIST}

RULES: Mapping[str, Mapping[str, ArgRule]] = {
    "turns": TURN_RULES,
    "currentChapterTurns": {},
    "characters": CHARACTER_RULES,
    "chapterSummaries": SUMMARY_RULES,
    "target": {},
    "globals": {},
}

SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec(
        name="turns",
        returns="list[Turn]",
        args=spec_args(TURN_RULES),
        description="The chapter's turns; newest first unless order is 'asc'.",
    ),
    SourceSpec(
        name="currentChapterTurns",
        returns="list[Turn]",
        description="The chapter's turns in reading order (oldest first).",
    ),
    SourceSpec(
        name="characters",
        returns="list[Character]",
        args=spec_args(CHARACTER_RULES),
        description="The character roster in roster order.",
    ),
    SourceSpec(
        name="chapterSummaries",
        returns="list[ChapterSummary]",
        args=spec_args(SUMMARY_RULES),
        description="Summaries of the chapters before this one; newest first unless order is 'asc'.",
    ),
    SourceSpec(name="target", returns="ChapterTarget", description="The chapter being summarised."),
    SourceSpec(name="globals", returns="ChapterSummarizationGlobals", description="Story-wide scalars."),
)

_REGISTRY = SourceRegistry(
    {
        "turns": checked_handler(
            "turns", TURN_RULES, lambda ctx, args: select_turns(context_list(ctx, "turns"), args)
        ),
        "currentChapterTurns": checked_handler(
            "currentChapterTurns", {}, lambda ctx, _args: context_list(ctx, "turns")
        ),
        "characters": checked_handler(
            "characters",
            CHARACTER_RULES,
            lambda ctx, args: select_characters(context_list(ctx, "characters"), args),
        ),
        "chapterSummaries": checked_handler(
            "chapterSummaries",
            SUMMARY_RULES,
            lambda ctx, args: select_summaries(context_list(ctx, "chapterSummaries"), args),
        ),
        "target": checked_handler("target", {}, lambda ctx, _args: ctx.get("target")),
        "globals": checked_handler("globals", {}, lambda ctx, _args: ctx.get("globals")),
    }
)


def make_registry(ctx: Mapping[str, Any]) -> SourceRegistry:
    """The registry for a chapter-summary context (handlers read the ctx they are given)."""
    return _REGISTRY


TASK = register_task_kind(
    TaskKind(
        name="chapter_summarization",
        context_type=ChapterSummarizationContext,
        sources=SOURCES,
        registry_factory=make_registry,
        description="Summarise one finished chapter, keeping continuity with earlier summaries.",
        check_args=checker(RULES),
    )
)
