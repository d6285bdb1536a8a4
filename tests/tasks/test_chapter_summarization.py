"""The chapter_summarization task kind: sources, argument rules and registry."""

from __future__ import annotations

import re
from typing import Any

import pytest

from storyforge.tasks.base import get_task_kind
from storyforge.tasks.chapter_summarization import TASK

TURNS = [
    {"turnNo": n, "chapterNumber": 2, "authorName": f"A{n}", "authorType": "character", "content": f"c{n}"}
    for n in (4, 5, 6)
]
CTX: dict[str, Any] = {
    "turns": TURNS,
    "characters": [
        {"id": "x", "name": "X", "description": "d"},
        {"id": "y", "name": "Y", "description": "e"},
    ],
    "chapterSummaries": [
        {"chapterNumber": 1, "summaryText": "one"},
        {"chapterNumber": 0, "summaryText": "zero"},
    ],
    "target": {"chapterNumber": 2, "title": "Two", "turnCount": 3},
    "globals": {"storyTitle": "T", "targetWords": 80},
}


def test_task_is_registered_with_its_sources() -> None:
    """The kind is findable by name and publishes the chapter's sources."""
    assert get_task_kind("chapter_summarization") is TASK
    assert TASK.allowed_sources == (
        "turns",
        "currentChapterTurns",
        "characters",
        "chapterSummaries",
        "target",
        "globals",
    )
    specs = {s.name: s for s in TASK.sources}
    assert set(specs["characters"].args) == {"order", "limit", "ids"}
    assert dict(specs["currentChapterTurns"].args) == {}


@pytest.mark.parametrize(
    ("source", "args", "expected"),
    [
        pytest.param("currentChapterTurns", None, [4, 5, 6], id="reading-order"),
        pytest.param("turns", None, [6, 5, 4], id="turns-newest-first"),
        pytest.param("turns", {"order": "asc", "limit": 2}, [4, 5], id="turns-asc-limit"),
    ],
)
def test_turn_sources(source: str, args: Any, expected: list[int]) -> None:
    """The chapter's turns come in reading order, or ordered and limited through args."""
    assert [t["turnNo"] for t in TASK.registry(CTX)[source](CTX, args)] == expected


def test_summaries_target_and_globals() -> None:
    """Earlier summaries sort by chapter; target and globals come straight from the context."""
    registry = TASK.registry(CTX)
    assert [s["chapterNumber"] for s in registry["chapterSummaries"](CTX, {"order": "asc"})] == [0, 1]
    assert registry["target"](CTX, None) == {"chapterNumber": 2, "title": "Two", "turnCount": 3}
    assert registry["globals"](CTX, None)["targetWords"] == 80
    assert [c["id"] for c in registry["characters"](CTX, {"ids": ["y"]})] == ["y"]


@pytest.mark.parametrize(
    ("source", "args", "message"),
    [
        pytest.param(
            "characters",
            {"exclude_current": True},
            "source 'characters' has no arg 'exclude_current'. Accepted: order, limit, ids",
            id="no-actor-here",
        ),
        pytest.param(
            "currentChapterTurns",
            {"limit": 2},
            "source 'currentChapterTurns' takes no args, got {\"limit\": 2}",
            id="no-args",
        ),
        pytest.param(
            "chapterSummaries",
            {"limit": "2"},
            "arg 'limit' of source 'chapterSummaries' must be int >= 1, got \"2\"",
            id="string-limit",
        ),
    ],
)
def test_bad_args_raise(source: str, args: Any, message: str) -> None:
    """Bad args raise ValueError naming the source and the argument."""
    with pytest.raises(ValueError, match=re.escape(message)):
        TASK.registry(CTX)[source](CTX, args)


def test_check_args_reports_bad_values() -> None:
    """Lint-time check_args reports bad values of declared args and nothing for good ones."""
    assert TASK.check_args is not None
    assert list(TASK.check_args("turns", {"order": "asc"})) == []
    assert list(TASK.check_args("turns", {"chapter": 0})) == [
        "arg 'chapter' of source 'turns' must be int >= 1, got 0"
    ]
