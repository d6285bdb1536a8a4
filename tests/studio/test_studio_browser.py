"""The studio page in a real Chromium (Debian's /usr/bin/chromium, driven by Playwright).

Each test drives the page as an author would: types into the template, moves the budget
slider, clicks Save, and checks what the page shows. Screenshots of each state go to the test
artifacts folder ($STORYFORGE_TEST_ARTIFACTS/studio, else tests/artifacts/studio). Playwright
never downloads a browser here: it launches the system Chromium by path.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from studio_support import Running

from storyforge.store import TemplateStore

pytestmark = pytest.mark.browser

TINY = (Path(__file__).resolve().parent / "tiny_turn.yaml").read_text(encoding="utf-8")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 20_000


def _chromium() -> str:
    path = os.environ.get("STORYFORGE_CHROMIUM") or "/usr/bin/chromium"
    if not (Path(path).is_file() or shutil.which(path)):
        pytest.fail(
            f"the browser tests need Debian's Chromium at {path} (apt-get install chromium; "
            "or set STORYFORGE_CHROMIUM)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless system Chromium for the module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any, studio: Running) -> Iterator[Any]:
    """A fresh page on the studio, loaded and rendered once; page errors fail the test."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(studio.url)
    tab.wait_for_selector("body[data-ready='true'][data-state='rendered']")
    try:
        yield tab
    finally:
        context.close()
    assert errors == []


def _replace_in_editor(page: Any, old: str, new: str) -> None:
    """Select where ``old`` and ``new`` differ in the editor and type the new part, key by key."""
    area = page.locator("#template")
    start = area.evaluate("(el, word) => el.value.indexOf(word)", old)
    assert start >= 0, old
    same = len(os.path.commonprefix([old, new]))
    area.evaluate(
        "(el, [a, b]) => { el.focus(); el.setSelectionRange(a, b); }", [start + same, start + len(old)]
    )
    page.keyboard.type(new[same:])


def _load_tiny(page: Any) -> None:
    page.locator("#template").fill(TINY)
    page.locator("#messages .msg[data-role='system'] pre", has_text="You are Iris Calloway.").wait_for()
    assert page.locator("#messages .msg[data-role='assistant'][data-prefix='true'] pre").inner_text() == (
        "Iris Calloway:"
    )


def test_page_loads_a_shipped_template_and_renders_it(page: Any, artifacts: Path) -> None:
    """On load the page opens a shipped template, its sample context, and shows messages and trace."""
    assert page.locator("#example-select").input_value() == "turn_writer"
    page.wait_for_function("() => document.getElementById('context-select').value === 'turn_generation'")
    page.wait_for_selector("#slots tr[data-slot='history'][data-verdict='kept']")
    assert page.locator("#messages .msg").count() == 3
    assert page.locator("#issue-count").inner_text() == "0"
    assert page.locator("#gutter div").count() == len(page.locator("#template").input_value().split("\n"))
    page.screenshot(path=str(artifacts / "01-loaded.png"))

    page.locator("#budget").focus()
    page.keyboard.press("Home")
    page.keyboard.press("PageUp")  # a tenth of the slider: 400 tokens
    assert page.locator("#budget-value").inner_text() == "400 tokens"
    page.locator("#totals", has_text="budget 400").wait_for()
    page.wait_for_selector("#layout tr[data-path='layout[5].header'][data-verdict='dropped']")
    assert page.locator("#layout tr[data-path='layout[0]']").get_attribute("data-verdict") == "dropped"
    assert page.locator("#slots tr[data-slot='history']").get_attribute("data-verdict") == "kept"
    assert "budget 400" in page.locator("#totals").inner_text()
    page.screenshot(path=str(artifacts / "01-loaded-budget-400.png"))


def test_a_typo_shows_its_issue_at_its_line_and_the_fix_shows_the_messages(
    page: Any, artifacts: Path
) -> None:
    """Typing a wrong source name flags line 19 with a hint; fixing it brings the messages back."""
    _load_tiny(page)
    _replace_in_editor(page, "source: turns", "source: turnz")
    issue = page.locator("#issues li[data-line='19']", has_text="unknown source 'turnz'")
    issue.wait_for()
    assert "unknown source 'turnz'" in issue.inner_text()
    assert page.locator("#issues li .hint").inner_text() == "Did you mean 'turns'?"
    assert page.locator("#gutter div.err").all_inner_texts() == ["19"]
    assert page.locator("#messages .msg").count() == 3  # the last good render stays, marked stale
    assert page.locator("#right.stale").count() == 1
    page.wait_for_selector("body[data-state='invalid']")
    assert page.locator("#status").inner_text() == "1 problem: fix it to see the messages"
    page.screenshot(path=str(artifacts / "02-typo.png"))

    _replace_in_editor(page, "source: turnz", "source: turns")
    page.wait_for_selector("body[data-state='rendered']")
    page.wait_for_selector("#issues li", state="detached")
    assert page.locator("#issue-count").inner_text() == "0"
    assert page.locator("#gutter div.err").count() == 0
    assert page.locator("#right.stale").count() == 0
    roles = page.locator("#messages .msg").evaluate_all("els => els.map(e => e.dataset.role)")
    assert roles == ["system", "user", "assistant"]
    assert page.locator("#messages .msg[data-role='system'] pre").inner_text() == "You are Iris Calloway."
    page.screenshot(path=str(artifacts / "03-fixed.png"))


def test_moving_the_budget_slider_drops_a_slot_in_the_trace(page: Any, artifacts: Path) -> None:
    """With the slider down to 10 tokens the history slot is dropped by the budget, and says so."""
    _load_tiny(page)
    page.wait_for_selector("#slots tr[data-slot='history'][data-verdict='kept']")
    assert page.locator("#budget-value").inner_text() == "no limit"
    slider = page.locator("#budget")
    slider.focus()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    assert page.locator("#budget-value").inner_text() == "10 tokens"
    page.locator("#totals", has_text="budget 10").wait_for()  # the render for 10, not for 0 on the way
    row = page.locator("#slots tr[data-slot='history'][data-verdict='dropped']")
    row.wait_for()
    assert re.search(r"budget dropped \d+ messages?", row.inner_text()), row.inner_text()
    assert row.locator("td").last.inner_text() == "0 / 400"
    assert page.locator("#slots tr[data-slot='reply']").get_attribute("data-verdict") == "kept"
    roles = page.locator("#messages .msg").evaluate_all("els => els.map(e => e.dataset.role)")
    assert roles == ["system", "assistant"]
    assert "budget 10" in page.locator("#totals").inner_text()
    page.screenshot(path=str(artifacts / "04-budget-dropped.png"))


def test_saving_stores_revisions_refuses_invalid_ones_and_diffs_them(
    page: Any, studio: Running, artifacts: Path
) -> None:
    """Save adds revisions 1 and 2 to the SQLite store, refuses an invalid one; Diff and Open show them."""
    _load_tiny(page)
    page.click("#save")
    page.wait_for_selector("body[data-saved='tiny_turn@1']")
    assert page.locator("#status").inner_text() == "added: tiny_turn revision 1 in the store"
    page.screenshot(path=str(artifacts / "05-saved.png"))

    _replace_in_editor(page, "role: system", "role: sistem")
    page.wait_for_selector("body[data-state='invalid']")
    page.click("#save")
    page.wait_for_selector("#status:text('not saved: 1 problem in the template')")
    assert page.locator("#issues li[data-line='7'] .hint").inner_text() == "Did you mean 'system'?"
    page.screenshot(path=str(artifacts / "06-save-refused.png"))

    _replace_in_editor(page, "role: sistem", "role: system")
    _replace_in_editor(page, "You are {{actor.name}}.", "You are {{actor.name}} of {{globals.setting}}.")
    page.wait_for_selector("body[data-state='rendered']")
    page.click("#save")
    page.wait_for_selector("body[data-saved='tiny_turn@2']")
    assert page.locator("#revision-select option").all_inner_texts() == ["revision 1", "revision 2"]

    with TemplateStore(studio.store_url) as store:
        assert [r.revision for r in store.revisions("tiny_turn")] == [1, 2]
        assert "{{globals.setting}}" in store.get("tiny_turn").raw
        assert "{{globals.setting}}" not in store.get("tiny_turn", revision=1).raw

    page.click("#diff")
    page.wait_for_selector("#diff-output div.add")
    assert page.locator("#diff-output div.del").all_inner_texts() == ["-You are Iris Calloway."]
    added = page.locator("#diff-output div.add").all_inner_texts()
    assert len(added) == 1 and added[0].startswith("+You are Iris Calloway of Saltmarsh")
    page.screenshot(path=str(artifacts / "07-diff.png"))

    page.select_option("#revision-select", "1")
    page.click("#open-revision")
    page.wait_for_selector("#status:text('opened tiny_turn revision 1')")
    text = page.locator("#template").input_value()
    assert "content: You are {{actor.name}}." in text and "globals.setting" not in text
    page.locator("#messages .msg[data-role='system'] pre", has_text="You are Iris Calloway.").wait_for()
