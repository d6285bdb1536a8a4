"""The writing_assistant task kind: sources, argument rules and registry."""

from __future__ import annotations

import re
from typing import Any

import pytest

from storyforge.tasks.base import get_task_kind
from storyforge.tasks.writing_assistant import TASK

CTX: dict[str, Any] = {
    "userText": "Make it shorter.",
    "context": ["p1", "p2", "p3"],
    "stylePrefs": {"styleGuide": "Plain.", "tone": "warm", "notes": ["n1", "n2"]},
    "globals": {"documentTitle": "Doc"},
}


def test_task_is_registered_with_its_sources() -> None:
    """The kind is findable by name and publishes the original StoryForge source names."""
    assert get_task_kind("writing_assistant") is TASK
    assert TASK.allowed_sources == (
        "userText",
        "context",
        "stylePrefs",
        "styleGuide",
        "tone",
        "styleNotes",
        "globals",
    )


@pytest.mark.parametrize(
    ("source", "args", "expected"),
    [
        pytest.param("userText", None, "Make it shorter.", id="request"),
        pytest.param("context", None, ["p1", "p2", "p3"], id="excerpt"),
        pytest.param("context", {"limit": 2}, ["p2", "p3"], id="excerpt-keeps-nearest-the-cursor"),
        pytest.param("context", {"limit": 10}, ["p1", "p2", "p3"], id="limit-above-length"),
        pytest.param("styleGuide", None, "Plain.", id="guide"),
        pytest.param("tone", None, "warm", id="tone"),
        pytest.param("styleNotes", None, ["n1", "n2"], id="notes"),
        pytest.param("globals", None, {"documentTitle": "Doc"}, id="globals"),
    ],
)
def test_handlers(source: str, args: Any, expected: Any) -> None:
    """Each source returns its part of the context."""
    assert TASK.registry(CTX)[source](CTX, args) == expected


def test_missing_style_prefs_give_none_and_empty_notes() -> None:
    """Without stylePrefs the style sources are absent and the notes list is empty."""
    ctx = {"userText": "x", "context": []}
    registry = TASK.registry(ctx)
    assert registry["styleGuide"](ctx, None) is None
    assert registry["tone"](ctx, None) is None
    assert registry["styleNotes"](ctx, None) == []
    assert registry["stylePrefs"](ctx, None) is None


@pytest.mark.parametrize(
    ("ctx", "source", "args", "error", "message"),
    [
        pytest.param(
            CTX,
            "context",
            {"limit": 0},
            ValueError,
            "arg 'limit' of source 'context' must be int >= 1, got 0",
            id="limit-zero",
        ),
        pytest.param(CTX, "tone", {"x": 1}, ValueError, "source 'tone' takes no args", id="no-args"),
        pytest.param(
            {"stylePrefs": "loud"},
            "tone",
            None,
            TypeError,
            "context field 'stylePrefs' must be a mapping, got str",
            id="prefs-not-mapping",
        ),
        pytest.param(
            {"stylePrefs": {"notes": "one"}},
            "styleNotes",
            None,
            TypeError,
            "context field 'stylePrefs.notes' must be a list, got str",
            id="notes-not-list",
        ),
        pytest.param(
            {"context": "one paragraph"},
            "context",
            None,
            TypeError,
            "context field 'context' must be a list, got str",
            id="excerpt-not-list",
        ),
    ],
)
def test_bad_args_and_bad_context_raise(
    ctx: dict[str, Any], source: str, args: Any, error: type[Exception], message: str
) -> None:
    """Bad args and mistyped context fields raise with a message naming them."""
    with pytest.raises(error, match=re.escape(message)):
        TASK.registry(ctx)[source](ctx, args)
