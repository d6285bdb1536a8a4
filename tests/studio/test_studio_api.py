"""The studio's JSON API over real HTTP on loopback: check, render, sample contexts, store."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from studio_support import ROOT, Running

HERE = Path(__file__).resolve().parent
TINY = (HERE / "tiny_turn.yaml").read_text(encoding="utf-8")
CONTEXT = json.loads((ROOT / "conf" / "context" / "turn_generation.json").read_text(encoding="utf-8"))


def _edit(old: str, new: str) -> str:
    assert TINY.count(old) == 1, old
    return TINY.replace(old, new)


# -- check ---------------------------------------------------------------------------------------


def test_index_page_is_served(studio: Running) -> None:
    """GET / returns the page's HTML with a restrictive content security policy."""
    reply = studio.get("/")
    assert reply.status == 200
    assert b"<title>storyforge studio</title>" in reply.body
    assert "default-src 'self'" in reply.headers["content-security-policy"]
    assert reply.headers["x-content-type-options"] == "nosniff"


def test_static_files_are_served(studio: Running) -> None:
    """The page's script and style come from the package, with their content types."""
    script = studio.get("/static/studio.js")
    assert script.status == 200
    assert "javascript" in script.headers["content-type"]
    assert b"/api/render" in script.body
    assert studio.get("/static/studio.css").status == 200


def test_check_reports_a_valid_template(studio: Running) -> None:
    """A valid template checks clean and names its task kind."""
    reply = studio.post("/api/check", {"template": TINY})
    assert reply.status == 200
    assert reply.json() == {"ok": True, "task": "turn_generation", "issues": [], "notes": []}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            _edit("source: turns", "source: turnz"),
            {
                "code": "unknown_source",
                "path": "slots.history.plan[0].source",
                "line": 19,
                "column": 9,
                "hint": "Did you mean 'turns'?",
            },
            id="unknown_source",
        ),
        pytest.param(
            _edit("role: system", "role: sistem"),
            {
                "code": "schema",
                "path": "layout[0].role",
                "line": 7,
                "column": 5,
                "hint": "Did you mean 'system'?",
            },
            id="bad_role",
        ),
        pytest.param(
            _edit('"{{actor.name}}:"', '"{{actor.name | uper}}:"'),
            {
                "code": "syntax",
                "path": "slots.reply.plan[0].content",
                "line": 30,
                "column": 34,  # the filter's name, inside the quoted string
                "hint": "Did you mean 'upper'?",
            },
            id="unknown_filter_inside_string",
        ),
        pytest.param(
            _edit("  reply:\n", "  history:\n    priority: 3\n  reply:\n"),
            {"code": "duplicate_key", "path": "slots.history", "line": 25, "column": 3, "hint": None},
            id="duplicate_slot",
        ),
        pytest.param(
            _edit("layout:\n", "layout\n"),
            {"code": "syntax", "path": "<template>", "line": 6, "column": 9, "hint": None},
            id="yaml_syntax",
        ),
        pytest.param(
            '{"id": "x",\n "name": }',
            {"code": "syntax", "path": "<template>", "line": 2, "column": 10, "hint": None},
            id="json_syntax",
        ),
    ],
)
def test_check_places_each_issue_at_its_line_and_column(
    studio: Running, text: str, expected: dict[str, Any]
) -> None:
    """Each kind of authoring problem comes back at its file line and column, with its hint."""
    reply = studio.post("/api/check", {"template": text})
    assert reply.status == 200
    body = reply.json()
    assert body["ok"] is False
    first = body["issues"][0]
    assert {key: first[key] for key in expected} == expected
    assert first["where"] == "template"
    if expected["hint"]:
        assert expected["hint"] in first["message"]


def test_check_message_reads_like_a_sentence(studio: Running) -> None:
    """The unknown-source message names what was found, the suggestion and what is allowed."""
    body = studio.post("/api/check", {"template": _edit("source: turns", "source: turnz")}).json()
    assert body["issues"][0]["message"] == (
        "unknown source 'turnz'. Did you mean 'turns'? Allowed: turns, characters, actor, intent, "
        "currentIntent, chapterSummaries, globals (plus the reserved $item, $index, $parent, $globals, "
        "$ctx) (template:19)"
    )


# -- render --------------------------------------------------------------------------------------


def _render(studio: Running, budget: int | None, template: str = TINY, context: Any = None) -> dict[str, Any]:
    reply = studio.post(
        "/api/render",
        {"template": template, "context": CONTEXT if context is None else context, "budget": budget},
    )
    assert reply.status == 200, reply.body
    return reply.json()  # type: ignore[no-any-return]


def test_render_returns_messages_with_roles_prefix_and_tokens(studio: Running) -> None:
    """Without a budget every message is emitted; tokens are ceil(len/4) of each message."""
    body = _render(studio, None)
    assert body["ok"] is True and body["issues"] == []
    roles = [(m["role"], m["prefix"]) for m in body["messages"]]
    assert roles == [("system", False), ("user", False), ("assistant", True)]
    assert body["messages"][0]["content"] == "You are Iris Calloway."
    assert body["messages"][2]["content"] == "Iris Calloway:"
    for message in body["messages"]:
        assert message["tokens"] == math.ceil(len(message["content"]) / 4)
    assert body["budget"]["max_tokens"] is None
    assert body["budget"]["emitted"] == sum(m["tokens"] for m in body["messages"])
    assert [(s["name"], s["verdict"], s["max_tokens"]) for s in body["slots"]] == [
        ("reply", "kept", None),
        ("history", "kept", 400),
    ]
    assert body["trace"]["template"] == "tiny_turn"


@pytest.mark.parametrize(
    ("budget", "history", "system"),
    [
        pytest.param(None, "kept", "kept", id="unlimited"),
        pytest.param(100, "partial", "dropped", id="some-history"),
        pytest.param(10, "dropped", "kept", id="no-history"),
    ],
)
def test_render_trace_shows_what_the_budget_dropped(
    studio: Running, budget: int | None, history: str, system: str
) -> None:
    """The slot and layout verdicts follow the budget, and nothing emitted exceeds it."""
    body = _render(studio, budget)
    slots = {s["name"]: s for s in body["slots"]}
    assert slots["history"]["verdict"] == history
    assert (slots["history"]["dropped"] > 0) == (history != "kept")
    assert slots["reply"]["verdict"] == "kept"
    layout = {item["path"]: item for item in body["layout"]}
    assert layout["layout[0]"]["verdict"] == system
    if system == "dropped":
        assert layout["layout[0]"]["reason"] == "over_budget"
    if budget is not None:
        assert body["trace"]["budget"]["consumed"] <= budget


def test_render_of_an_invalid_template_gives_issues_and_no_messages(studio: Running) -> None:
    """A template with problems is not rendered; the issues come back instead."""
    body = _render(studio, None, template=_edit("source: turns", "source: turnz"))
    assert body["ok"] is False
    assert body["messages"] == [] and body["trace"] is None
    assert [i["code"] for i in body["issues"]] == ["unknown_source"]


@pytest.mark.parametrize(
    ("context", "message", "line", "column"),
    [
        pytest.param('{\n  "turns": [,]\n}', "JSON syntax error: Expecting value", 2, 13, id="json"),
        pytest.param("[1, 2]", "the context must be a JSON object, got list", 1, 1, id="not-an-object"),
        pytest.param(
            "[" * 100_000 + "]" * 100_000,
            "the context nests arrays or objects too deeply to read",
            1,
            1,
            id="nested-too-deeply",
        ),
    ],
)
def test_render_reports_a_bad_context_at_its_line(
    studio: Running, context: str, message: str, line: int, column: int
) -> None:
    """Context text that is not a JSON object is an issue of the context, with its position."""
    body = _render(studio, None, context=context)
    assert body["ok"] is False
    assert body["issues"] == [
        {
            "where": "context",
            "code": "context",
            "path": "context",
            "line": line,
            "column": column,
            "message": message,
            "hint": None,
            "context": None,
        }
    ]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param(
            {"template": TINY, "budget": -1}, "budget: expected a whole number from 0", id="negative"
        ),
        pytest.param(
            {"template": TINY, "budget": "10"}, 'budget: expected a whole number, got "10"', id="text"
        ),
        pytest.param(
            {"template": TINY, "budget": True}, "budget: expected a whole number, got true", id="bool"
        ),
        pytest.param({"budget": 10}, "template: expected a string, got NoneType", id="no-template"),
        pytest.param({"template": TINY, "format": "toml"}, "format: expected 'json' or 'yaml'", id="format"),
        pytest.param([1], "the request body must be a JSON object, got list", id="not-an-object"),
    ],
)
def test_render_refuses_malformed_requests(studio: Running, body: Any, error: str) -> None:
    """A malformed request is a 400 whose error names the field."""
    reply = studio.post("/api/render", body)
    assert reply.status == 400
    assert reply.json()["error"].startswith(error)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        pytest.param(b"template: x", "the request body is not JSON: ", id="yaml"),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000, "the request body is not JSON this page reads", id="deep"
        ),
    ],
)
def test_render_refuses_a_body_that_is_not_json(studio: Running, raw: bytes, error: str) -> None:
    """Bytes that are not JSON, or JSON nested past what the reader follows, are a 400, not a crash."""
    reply = studio.post("/api/render", raw=raw)
    assert reply.status == 400
    assert reply.json()["error"].startswith(error)


# -- files fixed at start ------------------------------------------------------------------------


def test_sample_contexts_are_listed_per_task_kind(studio: Running) -> None:
    """The task kind's sample contexts are listed, and one loads as data (generated ones too)."""
    assert studio.get("/api/contexts?task=turn_generation").json() == [
        {"name": "turn_generation"},
        {"name": "turn_generation_long"},
    ]
    assert studio.get("/api/contexts?task=writing_assistant").json() == [{"name": "writing_assistant"}]
    long = studio.get("/api/contexts/turn_generation_long").json()
    assert len(long["context"]["turns"]) == 200


def test_shipped_templates_open_by_name(studio: Running) -> None:
    """Every shipped template is listed with its task kind and opens as its file's text."""
    listed = studio.get("/api/examples").json()
    names = {e["name"]: e["task"] for e in listed}
    assert names["turn_writer"] == "turn_generation"
    opened = studio.get("/api/examples/turn_writer").json()
    assert opened["text"] == (ROOT / "conf" / "template" / "turn_writer.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "path",
    [
        "/api/contexts/..%2F..%2Fpyproject",
        "/api/contexts/config",
        "/api/examples/..%2F..%2Fpyproject",
        "/static/../../pyproject.toml",
        "/static/%2e%2e/%2e%2e/%2e%2e/pyproject.toml",
    ],
)
def test_no_file_outside_the_listed_folders_is_served(studio: Running, path: str) -> None:
    """Names that are not listed, and paths that climb out of the folders, are 404."""
    reply = studio.get(path)
    assert reply.status == 404
    assert b"[project]" not in reply.body


# -- store ---------------------------------------------------------------------------------------


def test_store_save_revisions_open_and_diff(studio: Running) -> None:
    """Saving adds revisions; a revision reopens as valid text; diff renders both on one context."""
    first = studio.post("/api/templates", {"template": TINY})
    assert first.status == 200
    assert first.json()["status"] == "added" and first.json()["record"]["revision"] == 1
    again = studio.post("/api/templates", {"template": TINY})
    assert again.json()["status"] == "unchanged"
    changed = _edit("You are {{actor.name}}.", "You are {{actor.name}}, in {{globals.setting}}.")
    second = studio.post("/api/templates", {"template": changed})
    assert second.json()["status"] == "updated" and second.json()["record"]["revision"] == 2

    listed = studio.get("/api/templates").json()
    assert [(t["id"], t["revision"]) for t in listed] == [("tiny_turn", 2)]
    revisions = studio.get("/api/templates/tiny_turn/revisions").json()
    assert [r["revision"] for r in revisions] == [1, 2]
    opened = studio.get("/api/templates/tiny_turn/revisions/1").json()
    assert studio.post("/api/check", {"template": opened["text"]}).json()["ok"] is True
    assert "You are {{actor.name}}." in opened["text"]

    diff = studio.post("/api/diff", {"id": "tiny_turn", "a": 1, "b": 2, "context": CONTEXT, "budget": None})
    assert diff.status == 200
    body = diff.json()
    assert body["same"] is False
    assert "-You are Iris Calloway." in body["diff"]
    assert any(line.startswith("+You are Iris Calloway, in Saltmarsh") for line in body["diff"])
    same = studio.post("/api/diff", {"id": "tiny_turn", "a": 2, "b": 2, "context": CONTEXT}).json()
    assert same["same"] is True and same["diff"] == []


def test_store_refuses_an_invalid_template_with_its_issues(studio: Running) -> None:
    """An invalid template is not saved: 422 with every issue, and the store is unchanged."""
    before = studio.get("/api/templates").json()
    bad = _edit("id: tiny_turn", "id: tiny_bad").replace("source: turns", "source: turnz")
    reply = studio.post("/api/templates", {"template": bad})
    assert reply.status == 422
    body = reply.json()
    assert body["error"] == "not saved: 1 problem in the template"
    assert [(i["code"], i["line"]) for i in body["issues"]] == [("unknown_source", 19)]
    assert studio.get("/api/templates").json() == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/templates/nope/revisions", None),
        ("GET", "/api/templates/nope/revisions/1", None),
        ("POST", "/api/diff", {"id": "nope", "a": 1, "b": 2, "context": {}}),
    ],
)
def test_store_unknown_ids_are_404(studio: Running, method: str, path: str, body: Any) -> None:
    """An unknown template id is a 404 naming it."""
    reply = studio.request(method, path, body)
    assert reply.status == 404
    assert "'nope'" in reply.json()["error"]


def test_a_context_string_with_a_lone_surrogate_renders(studio: Running) -> None:
    """A lone surrogate in the context (from a JSON escape) is data: it renders, never a 500."""
    reply = studio.post("/api/render", {"template": TINY, "context": '{"actor": {"name": "Iris \\ud800"}}'})
    assert reply.status == 200, reply.json()


@pytest.mark.parametrize("bad_id", ["a/b", "../conf/config", "a\\b", "x\u0000y"])
def test_store_refuses_an_id_that_is_a_path(studio: Running, bad_id: str) -> None:
    """An id the store cannot keep as a name is refused on save (422 naming the rule), never saved unopenable."""
    before = studio.get("/api/templates").json()
    text = _edit("id: tiny_turn", "id: " + json.dumps(bad_id))
    reply = studio.post("/api/templates", {"template": text})
    assert reply.status == 422, reply.json()
    assert [i["code"] for i in reply.json()["issues"]] == ["unsafe_id"]
    assert studio.get("/api/templates").json() == before


@pytest.mark.parametrize("rev", [str(10**30), "9" * 5000], ids=["30-digits", "5000-digits"])
def test_a_huge_revision_number_is_404(studio: Running, rev: str) -> None:
    """A revision number past any integer column is an unknown revision (404), never a 500."""
    studio.post("/api/templates", {"template": TINY})
    reply = studio.get(f"/api/templates/tiny_turn/revisions/{rev}")
    assert reply.status == 404, reply.body[:300]
