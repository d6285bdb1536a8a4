"""The runs page in a real Chromium: a run made by the tests, one answer, a sweep, two jobs compared.

The runs folder is written by :mod:`tests.support.runs` through the real completion
stage, so the page reads what a run leaves. Screenshots of each state go to the test
artifacts folder ($STORYFORGE_TEST_ARTIFACTS/studio, else tests/artifacts/studio).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from studio_support import Running, make_regenerated_run, start_studio, stop_studio
from test_studio_browser import TIMEOUT_MS, browser

from tests.support.runs import add_chain_and_duplicate, make_run, make_sweep
from tests.support.scripted_stories import is_repair

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the Chromium fixture, shared with the template page's tests

HOSTILE = '<img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script>'


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_run(root / "story-run", 12)
    make_run(root / "cut-run", 4, cut_off_every=2)  # seeds 0 and 2: the first answer stopped at length
    add_chain_and_duplicate(make_run(root / "regen-dedup", 6))
    # a chain made by the real regeneration job; the repair turns it sent, kept beside it
    sent = [b["messages"][-1]["content"] for b in make_regenerated_run(root / "regenerated") if is_repair(b)]
    (root / "repair-turns.json").write_text(json.dumps(sent), "utf-8")
    # a judged run whose judge never answers with a verdict (allowed by the error limit)
    make_regenerated_run(
        root / "judged", "judge=content_safety", "judge.retries=0", "provider.max_error_rate=1"
    )
    make_sweep(
        root / "sweep", 20, [("provider.temperature", ["0.2", "0.9"]), ("provider.model", ["small", "large"])]
    )
    # the diversity figures a sweep with the dedup stage reports per job
    report = json.loads((root / "sweep" / "sweep_report.json").read_text("utf-8"))
    for job in report["jobs"]:
        job["diversity"] = {"distinct_2": 0.5 + int(job["job"]) / 10, "self_bleu": None}
    (root / "sweep" / "sweep_report.json").write_text(json.dumps(report), "utf-8")
    hostile = make_run(root / f"hostile{HOSTILE.replace('/', '_')}", 8, plant=HOSTILE)
    # A label from a later stage, planted in the JSONL (the twin removed: the JSONL is then read).
    lines = (hostile / "validated.jsonl").read_text("utf-8").splitlines()
    first = json.loads(lines[0])
    first["labels"] = [*first["labels"], HOSTILE]
    first["passed"] = False
    lines[0] = json.dumps(first)
    (hostile / "validated.jsonl").write_text("\n".join(lines) + "\n", "utf-8")
    (hostile / "validated.parquet").unlink()
    return root


@pytest.fixture(scope="module")
def runs_studio(runs_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("store") / "store.db"
    running, server, thread = start_studio(f"sqlite:///{db}", runs=runs_folder)
    try:
        yield running
    finally:
        stop_studio(server, thread)


@pytest.fixture
def page(browser: Any, runs_studio: Running) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    dialogs: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.goto(runs_studio.url + "runs")
    tab.wait_for_selector("body[data-ready='true']")
    try:
        yield tab
    finally:
        context.close()
    assert errors == []
    assert dialogs == []


def _ready(page: Any) -> None:
    page.wait_for_selector("body[data-ready='true']")


def _click(page: Any, locator: Any) -> None:
    """Click, then wait until the view the click asked for (the URL's hash) is drawn."""
    before = page.evaluate("() => location.hash")
    locator.click()
    page.wait_for_function("h => location.hash !== h", arg=before)
    page.wait_for_function(
        "() => document.body.dataset.ready === 'true' && document.body.dataset.hash === location.hash.slice(1)"
    )


def _open(page: Any, name: str) -> None:
    _click(
        page,
        page.locator("#run-list li").filter(has=page.locator(f"a:text-is({json.dumps(name)})")).locator("a"),
    )


def test_runs_are_listed_newest_first(page: Any) -> None:
    """The runs and the sweep (with its jobs under it) are listed, newest first."""
    names = page.locator("#run-list li").evaluate_all("els => els.map(e => e.dataset.name)")
    assert names[0].startswith("hostile")  # written last
    assert names.index("sweep") < names.index("story-run")
    assert {"sweep/0", "sweep/1", "sweep/2", "sweep/3"} <= set(names)


def test_filter_to_a_label_and_open_a_failing_answer(page: Any, artifacts: Path) -> None:
    """Filter the run to missing_required, open the first answer: 3 numbered sentences, 'old tree' missing."""
    _open(page, "story-run")
    assert page.locator("#page-info").get_attribute("data-total") == "25"
    assert page.locator("#chart-labels .bar[data-label='missing_required'] .value").inner_text() == "6"
    page.wait_for_selector("body[data-indexing='false']")  # the index is built: every chart is drawn
    assert page.locator("#chart-sentences .bar").count() == 2  # 3 and 6 sentences
    ranges = page.locator("#chart-ranges .bar")  # every seed asks for 3 to 5: its 12 sample 0s of 25 pass
    assert ranges.evaluate_all("els => els.map(e => e.dataset.label)") == ["3..5 sentences"]
    assert ranges.locator(".value").inner_text() == "48.0% of 25"
    page.screenshot(path=str(artifacts / "runs-01-run.png"))

    page.locator("#f-label").select_option("missing_required")
    page.wait_for_selector("#page-info[data-total='6']")
    rows = page.locator("#answers tbody tr")
    assert rows.count() == 6
    assert all("missing_required" in t for t in rows.all_inner_texts())
    page.screenshot(path=str(artifacts / "runs-02-filtered.png"))

    _click(page, rows.first)
    assert page.locator("#sentence-count").get_attribute("data-count") == "3"
    numbers = page.locator("#answer-text sup.sentence-no").all_inner_texts()
    assert numbers == ["1", "2", "3"]
    assert page.locator("#answer-text .sentence[data-n='1']").first.inner_text().startswith("Zib")
    missing = page.locator("#required-list li[data-found='false']")
    assert missing.count() == 1
    assert missing.get_attribute("data-phrase") == "old tree"
    assert page.locator("#required-list li[data-found='true']").get_attribute("data-phrase") == "red ball"
    assert page.locator("#answer-text .mark-required").inner_text() == "red ball"
    assert (
        page.locator("#answer-messages .msg[data-role='user'] pre")
        .inner_text()
        .startswith("Write a children's story.")
    )
    assert "identically" in page.locator("#trace-note").inner_text()
    assert page.locator("#answer-trace tbody tr").count() >= 1
    assert page.locator("#reasons li").all_inner_texts() == ["missing required phrase 'old tree'"]
    page.screenshot(path=str(artifacts / "runs-03-answer.png"), full_page=True)

    _click(page, page.locator("#back"))
    assert page.locator("#f-label").input_value() == "missing_required"


def test_a_banned_phrase_is_highlighted(page: Any) -> None:
    """Sample 3 names the banned 'dragon': the phrase is marked on the text and listed as found."""
    _open(page, "story-run")
    page.locator("#f-label").select_option("contains_banned")
    page.wait_for_selector("#page-info[data-total='3']")
    _click(page, page.locator("#answers tbody tr").first)
    assert page.locator("#answer-text .mark-banned").inner_text() == "dragon"
    assert page.locator("#banned-list li[data-found='true']").get_attribute("data-phrase") == "dragon"


def test_a_cut_off_answer_is_marked(page: Any) -> None:
    """An answer that stopped at the token limit says so beside its verdict."""
    _open(page, "cut-run")
    page.locator("#f-label").select_option("other")
    page.wait_for_selector("#page-info[data-total='2']")
    _click(page, page.locator("#answers tbody tr").first)
    verdict = page.locator("#answer-verdict")
    assert verdict.locator(".cut-off").inner_text() == "cut off at the token limit (finish_reason 'length')"
    assert "failed" in verdict.inner_text()


def test_attempts_and_a_near_duplicate_are_shown_beside_the_answer(page: Any, artifacts: Path) -> None:
    """A regeneration chain shows every attempt with its labels and repair turn; a repeat shows
    the kept member beside it with the shared shingles marked."""
    _open(page, "regen-dedup")
    assert page.locator("#answers th[data-sort='attempt']").count() == 1
    assert page.locator("#answers th[data-sort='cluster']").count() == 1
    _click(page, page.locator("#answers tbody tr[data-row='1']"))
    attempts = page.locator("#attempts .attempt")
    assert attempts.count() == 2
    assert "missing_required" in attempts.nth(0).inner_text()
    assert "Your story misses 'old tree'" in attempts.nth(1).locator("pre.repair").inner_text()
    assert page.locator("#duplicate-box").is_hidden()
    _click(page, page.locator("#back"))
    page.locator("#f-label").select_option("near_duplicate")
    page.wait_for_selector("#page-info[data-total='1']")
    _click(page, page.locator("#answers tbody tr").first)
    assert page.locator("#duplicate-box").is_visible()
    assert "near_duplicate" in page.locator("#answer-verdict").inner_text()
    assert "kept: ts-0000000 sample 0" in page.locator("#duplicate-note").inner_text()
    assert page.locator("#dup-mine .mark-shared").count() >= 1
    assert page.locator("#dup-kept .mark-shared").count() >= 1
    page.screenshot(path=str(artifacts / "runs-08-near-duplicate.png"), full_page=True)


def test_a_regenerated_answer_shows_the_repair_turn_it_was_sent(
    page: Any, runs_folder: Path, artifacts: Path
) -> None:
    """A chain made by the regeneration job: the failed first attempt with its labels, then the
    repair turn the server received (rendered again by the engine) above the passing answer."""
    sent = json.loads((runs_folder / "repair-turns.json").read_text("utf-8"))
    _open(page, "regenerated")
    page.locator("#f-passed").select_option("false")
    page.wait_for_selector("#page-info[data-total='4']")
    _click(page, page.locator("#answers tbody tr").first)
    attempts = page.locator("#attempts .attempt")
    assert attempts.count() == 2
    first, second = attempts.nth(0), attempts.nth(1)
    assert {"wrong_sentence_count", "missing_required"} <= set(first.locator(".label").all_inner_texts())
    assert "failed" in first.locator("h4").inner_text() and first.locator("pre.repair").count() == 0
    assert "passed" in second.locator("h4").inner_text()
    shown = second.locator("pre.repair").inner_text()
    assert shown in sent and "Your story has 1 sentence" in shown
    assert "rendered again by the engine" in page.locator("#repair-note").inner_text()
    page.screenshot(path=str(artifacts / "runs-09-repair-turn.png"), full_page=True)


def test_a_judged_run_shows_the_reports_judge_section(page: Any, runs_folder: Path) -> None:
    """The judge line above a judged run's answers says what report/summary.json says; a run
    without a judge has none."""
    judge = json.loads((runs_folder / "judged" / "report" / "summary.json").read_text("utf-8"))["judge"]
    errors = judge["verdicts"]["error"]
    assert errors and judge["errors"]
    _open(page, "judged")
    line = page.locator("#run-judge")
    assert line.is_visible()
    assert f"pass 0, fail 0, error {errors}" in line.inner_text()
    for kind, n in judge["errors"].items():
        assert f"{kind} {n}" in line.inner_text()
    _open(page, "story-run")
    assert page.locator("#run-judge").is_hidden()


def test_sort_and_page_come_from_the_server(page: Any) -> None:
    """Sorting by characters descending puts the longest answer first; the pager moves by 50."""
    _open(page, "story-run")
    _click(page, page.locator("#answers th[data-sort='chars']"))
    before = page.evaluate("() => location.hash")
    page.locator("#answers th[data-sort='chars']").focus()
    page.keyboard.press("Enter")  # the keyboard sorts too
    page.wait_for_function("h => location.hash !== h", arg=before)
    page.wait_for_function(
        "() => document.body.dataset.ready === 'true' && document.body.dataset.hash === location.hash.slice(1)"
    )
    chars = [int(t) for t in page.locator("#answers tbody tr td:nth-child(6)").all_inner_texts()]
    assert chars == sorted(chars, reverse=True)


def test_sweep_heatmap_cell_opens_its_run_and_two_jobs_compare(page: Any, artifacts: Path) -> None:
    """The sweep opens as its pass-rate grid; a cell opens that job's run; job 1 vs job 0 lists the flips."""
    _open(page, "sweep")
    cells = page.locator("#heatmap td.cell")
    assert cells.count() == 4
    texts = cells.all_inner_texts()
    assert texts[0].startswith("48.8%")  # job 0: 20 of 41
    page.screenshot(path=str(artifacts / "runs-04-sweep.png"), full_page=True)
    page.locator("#metric").select_option("distinct_2")
    assert [t.split("\n")[0] for t in cells.all_inner_texts()] == ["0.500", "0.700", "0.600", "0.800"]
    assert page.locator("#heatmap-caption").inner_text().startswith("distinct_2")
    page.screenshot(path=str(artifacts / "runs-04-sweep-diversity.png"), full_page=True)
    page.locator("#metric").select_option("")

    page.locator("#cmp-a").select_option("sweep/1")
    page.locator("#cmp-b").select_option("sweep/0")
    page.locator("#compare").click()
    page.wait_for_selector("#compare-result:not([hidden])")
    _ready(page)
    assert page.locator("#compare-figures").get_attribute("data-flips") == "5"
    flips = page.locator("#flips tbody tr")
    assert flips.evaluate_all("els => els.map(e => e.dataset.id)") == [
        "ts-0000002",
        "ts-0000006",
        "ts-0000010",
        "ts-0000014",
        "ts-0000018",
    ]
    assert all("missing_required" in t for t in flips.all_inner_texts())
    page.screenshot(path=str(artifacts / "runs-05-compare.png"), full_page=True)

    _click(page, page.locator("#heatmap td.cell[data-job='3']"))
    assert page.locator("#run-title").inner_text() == "sweep/3"
    page.screenshot(path=str(artifacts / "runs-06-cell-opened.png"))


def test_text_from_runs_never_runs(page: Any, artifacts: Path) -> None:
    """Markup in outputs, seeds, labels and the run's name is shown as text; nothing executes."""
    name = page.locator("#run-list li").first.get_attribute("data-name")
    assert name is not None and "<img" in name
    _click(page, page.locator("#run-list li").first.locator("a"))
    assert HOSTILE in page.locator("#f-label").evaluate("s => [...s.options].map(o => o.value).join('')")
    assert HOSTILE in page.locator("#chart-themes").inner_text()
    _click(page, page.locator("#answers tbody tr").first)
    assert HOSTILE in page.locator("#answer-verdict").inner_text()
    _click(page, page.locator("#back"))
    _click(page, page.locator("#answers tbody tr[data-row='4']"))  # seed 1: planted everywhere
    text = "".join(page.locator("#answer-text > span").all_text_contents())  # without the sentence numbers
    assert HOSTILE in text
    assert HOSTILE in page.locator("#answer-messages").inner_text()
    assert HOSTILE in page.locator("#required-list").inner_text()
    assert page.locator("#view img, #run-list img, #view script").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    page.screenshot(path=str(artifacts / "runs-07-hostile.png"), full_page=True)
