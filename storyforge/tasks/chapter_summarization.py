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
from dataclasses import replace
from typing import NotRequired, TypedDict

from storyforge.engine.sources import (
    ORDER,
    POSITIVE_INT,
    STR_LIST,
    ArgRule,
    ContextSource,
    SourceTable,
    read_list,
)
from storyforge.tasks.base import register_table_kind
from storyforge.tasks.turn_generation import (
    SUMMARIES_SOURCE,
    TURNS_SOURCE,
    ChapterSummary,
    Character,
    ModelInfo,
    Turn,
    select_characters,
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

SOURCE_TABLE = SourceTable(
    replace(TURNS_SOURCE, description="The chapter's turns; newest first unless order is 'asc'."),
    ContextSource(
        name="currentChapterTurns",
        returns="list[Turn]",
        select=read_list("turns"),
        description="The chapter's turns in reading order (oldest first).",
    ),
    ContextSource(
        name="characters",
        returns="list[Character]",
        rules=CHARACTER_RULES,
        select=read_list("characters", select_characters),
        description="The character roster in roster order.",
    ),
    replace(
        SUMMARIES_SOURCE,
        description="Summaries of the chapters before this one; newest first unless order is 'asc'.",
    ),
    ContextSource(name="target", returns="ChapterTarget", description="The chapter being summarised."),
    ContextSource(name="globals", returns="ChapterSummarizationGlobals", description="Story-wide scalars."),
)
make_registry = SOURCE_TABLE.registry_for
"""The registry for a chapter-summary context (handlers read the ctx they are given)."""


TASK = register_table_kind(
    "chapter_summarization",
    ChapterSummarizationContext,
    SOURCE_TABLE,
    "Summarise one finished chapter, keeping continuity with earlier summaries.",
)
