"""Properties of the studio's check and render over any text (no server: the same functions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storyforge.store import TemplateStore
from storyforge.studio import Studio
from tests.strategies import leaf_texts

TINY = (Path(__file__).resolve().parent / "tiny_turn.yaml").read_text(encoding="utf-8")
STUDIO = Studio(store=TemplateStore("sqlite:///:memory:"))


def _well_formed(issues: list[dict[str, object]], text: str) -> None:
    lines = max(1, len(text.splitlines()) + 1)
    for issue in issues:
        assert isinstance(issue["message"], str) and issue["message"]
        line, column = issue["line"], issue["column"]
        assert line is None or (isinstance(line, int) and 1 <= line <= lines), issue
        assert column is None or (isinstance(column, int) and column >= 1), issue


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_any_text_checks_to_issues_or_ok(text: str) -> None:
    # st.text() never yields lone surrogates; test_a_lone_surrogate_escape_is_an_issue covers them
    """Any text gives a verdict: ok with no issues, or issues each placed within the text."""
    body = STUDIO.check_json(text)
    assert body["ok"] is (not body["issues"])
    _well_formed(body["issues"], text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(leaf_texts(), st.integers(min_value=0, max_value=500) | st.none())
def test_any_leaf_in_a_template_renders_or_reports_its_line(leaf: str, budget: int | None) -> None:
    """A template whose system message is any leaf text renders under the budget, or says where it is wrong."""
    quoted = json.dumps(leaf, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
    text = TINY.replace('"You are {{actor.name}}."', quoted)
    body = STUDIO.render(text, {"actor": {"name": "Iris"}}, budget)
    _well_formed(body["issues"], text)
    if body["ok"]:
        assert body["issues"] == []
        if budget is not None:
            assert body["budget"]["consumed"] <= budget
    else:
        assert body["messages"] == [] and any(i["line"] == 8 for i in body["issues"]), body["issues"]


@pytest.mark.parametrize(
    "text",
    [
        'id: a\nname: "\\ud800"\n',
        '{"id": "a", "name": "\\udc00"}',
    ],
)
def test_a_lone_surrogate_escape_is_an_issue(text: str) -> None:
    """An escape that decodes to a lone surrogate is reported as an issue, not a crash."""
    body = STUDIO.check_json(text)
    assert body["ok"] is False
    encoding = [i for i in body["issues"] if i["code"] == "encoding"]
    assert encoding, body["issues"]
    assert "surrogate" in encoding[0]["message"]
