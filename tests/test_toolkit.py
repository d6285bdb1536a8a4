"""The helpers every module shares, one of each: the "Did you mean" hint, the progress bar,
the names of the run's files, and the reader of JSONL lines (see also tests/test_jsontext.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from storyforge import runfiles
from storyforge.errors import closest, did_you_mean
from storyforge.progress import UnitCounts, progress_bar

PACKAGE = Path(__file__).resolve().parents[1] / "storyforge"


@pytest.mark.parametrize(
    ("word", "options", "kwargs", "expected"),
    [
        pytest.param("sed", ["seed", "split"], {}, " Did you mean 'seed'?", id="quoted"),
        pytest.param("zzz", ["seed", "split"], {}, "", id="nothing-near"),
        pytest.param("sed", [], {}, "", id="no-options"),
        pytest.param(
            "titel", {"title", "body"}, {"show": '"{}"'.format}, ' Did you mean "title"?', id="shown"
        ),
        pytest.param("mdel", ("model",), {"show": str}, " Did you mean model?", id="bare"),
        pytest.param("max_attemps", ["max_attempts"], {"cutoff": 0.99}, "", id="cutoff-too-high"),
        pytest.param("it's", ["it's", "its"], {}, ' Did you mean "it\'s"?', id="repr-of-a-quote"),
    ],
)
def test_did_you_mean(word: str, options: object, kwargs: dict[str, object], expected: str) -> None:
    assert did_you_mean(word, options, **kwargs) == expected  # type: ignore[arg-type]


def test_closest_is_the_nearest_option_or_none() -> None:
    assert closest("temprature", ["top_p", "temperature", "seed"]) == "temperature"
    assert closest("temprature", ["top_p", "seed"]) is None
    assert closest("mdl", ["model"], cutoff=0.5) == "model"


@pytest.mark.parametrize(
    ("show", "disabled"),
    [pytest.param(True, False, id="shown"), pytest.param(False, True, id="hidden")],
)
def test_progress_bar_is_shown_or_hidden_as_asked(
    show: bool, disabled: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    with progress_bar(range(3), desc="stage", unit="item", show=show) as bar:
        assert bar.disable is disabled
        assert list(bar) == [0, 1, 2]
    drawn = capsys.readouterr().err
    assert ("stage: 100%" in drawn and "3/3" in drawn and "item/s" in drawn) is show


def test_progress_bar_with_show_none_is_drawn_only_on_a_terminal() -> None:
    """pytest's stderr is not a terminal, so the bar stays hidden."""
    with progress_bar(total=5, desc="stage", unit="req") as bar:
        assert bar.disable is True


def test_unit_counts_keep_each_units_latest_report() -> None:
    counts = UnitCounts()
    counts.report(0, 3, 1)
    counts.report(1, 2, 0)
    counts.report(0, 5, 1)
    assert counts.totals() == (7, 1)


def _modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "testing" not in p.relative_to(PACKAGE).parts]


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_the_run_file_names_are_spelled_only_in_runfiles() -> None:
    names = {value for key, value in vars(runfiles).items() if key.isupper() and isinstance(value, str)}
    names.discard(runfiles.REPORT_DIR)  # "report" is also a plain word
    spelled = {
        str(path.relative_to(PACKAGE)): sorted(_literals(path) & names)
        for path in _modules()
        if path.name != "runfiles.py"
    }
    assert {path: found for path, found in spelled.items() if found} == {}


@pytest.mark.parametrize(
    ("pattern", "home"),
    [
        pytest.param(r"get_close_matches\(", "engine/errors.py", id="did-you-mean"),
        pytest.param(r"\btqdm\(", "progress.py", id="progress-bar"),
    ],
)
def test_one_implementation_of_each(pattern: str, home: str) -> None:
    found = sorted(
        str(path.relative_to(PACKAGE))
        for path in _modules()
        if re.search(pattern, path.read_text(encoding="utf-8"))
    )
    assert found == [home]
