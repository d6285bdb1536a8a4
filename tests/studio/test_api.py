"""The studio's JSON API over real HTTP on loopback: check, render, contexts, store."""

from __future__ import annotations

from tests.studio.conftest import ROOT, Running

TURN_WRITER = (ROOT / "conf" / "template" / "turn_writer.yaml").read_text(encoding="utf-8")


def test_index_page_is_served(studio: Running) -> None:
    """GET / returns the page's HTML with a restrictive content security policy."""
    reply = studio.get("/")
    assert reply.status == 200
    assert b"storyforge studio" in reply.body
    assert "default-src 'self'" in reply.headers["content-security-policy"]


def test_check_reports_a_valid_template(studio: Running) -> None:
    """A shipped template checks clean and names its task kind."""
    reply = studio.post("/api/check", {"template": TURN_WRITER})
    assert reply.status == 200
    assert reply.json() == {"ok": True, "task": "turn_generation", "issues": [], "notes": []}
