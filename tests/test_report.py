"""The validation report: counts, summary.json/summary.md, the PNG plots and the logged table."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from storyforge.config.exports import export_options
from storyforge.tasks.tinystories.outputs import process_completions
from storyforge.tasks.tinystories.report import (
    PLOTS,
    ValidationStats,
    headline_table,
    label_figure,
    markdown_report,
    sentence_figure,
    write_report,
)
from storyforge.tasks.tinystories.validate import ValidationResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def result(labels: tuple[str, ...] = (), count: int = 4) -> ValidationResult:
    reasons = tuple(f"because {label}" for label in labels)
    return ValidationResult(passed=not labels, labels=labels, sentence_count=count, reasons=reasons)


def filled_stats() -> ValidationStats:
    stats = ValidationStats()
    rows: list[tuple[str, str, str, ValidationResult, object, str | None]] = [
        ("a", "kindness", "train", result(count=4), "x" * 100, "stop"),
        ("a", "kindness", "train", result(("missing_required",), count=4), "x" * 300, "stop"),
        ("b", "courage", "val", result(("wrong_sentence_count",), count=2), "x" * 200, "length"),
        ("b", "courage", "val", result(("wrong_sentence_count", "too_long"), count=11), "x" * 2500, None),
        ("c", "courage", "train", result(("other",), count=0), None, None),
    ]
    for seed_id, theme, split, res, output, finish in rows:
        stats.add(
            seed_id=seed_id,
            theme=theme,
            split=split,
            bounds=(3, 9),
            result=res,
            output=output,
            finish_reason=finish,
        )
    return stats


def test_stats_summary_numbers() -> None:
    """Counts by label, theme and split, the sentence histogram against bounds, lengths and seed coverage."""
    summary = filled_stats().summary(total_seeds=5)
    assert summary == {
        "validated": 5,
        "passed": 1,
        "failed": 4,
        "pass_rate": 0.2,
        "labels": {
            "missing_required": 1,
            "contains_banned": 0,
            "wrong_sentence_count": 2,
            "too_long": 1,
            "other": 1,
        },
        "by_theme": {
            "courage": {"validated": 3, "passed": 0, "pass_rate": 0.0},
            "kindness": {"validated": 2, "passed": 1, "pass_rate": 0.5},
        },
        "by_split": {
            "train": {"validated": 3, "passed": 1, "pass_rate": 0.3333},
            "val": {"validated": 2, "passed": 0, "pass_rate": 0.0},
        },
        "sentence_counts": {
            "histogram": {
                "2": {"below": 1, "within": 0, "above": 0},
                "4": {"below": 0, "within": 2, "above": 0},
                "11": {"below": 0, "within": 0, "above": 1},
            },
            "bounds": {"3..9": 4},
        },
        "chars": {"mean": 775.0, "p50": 200, "p95": 2500, "max": 2500},
        "finish_reasons": {"length": 1, "stop": 2},
        "seeds": {"total": 5, "with_completions": 3, "with_pass": 1, "without_completions": 2},
    }


def test_empty_stats() -> None:
    """With nothing validated, rates and lengths are null rather than a division error."""
    summary = ValidationStats().summary(total_seeds=2)
    assert summary["pass_rate"] is None
    assert summary["chars"] == {"mean": None, "p50": None, "p95": None, "max": None}
    assert summary["seeds"]["without_completions"] == 2


def full_summary() -> dict[str, Any]:
    return {
        "source": {
            "file": "c.jsonl",
            "sha256": "0123456789abcdef" * 4,
            "lines": 7,
            "blank_lines": 0,
            "formats": {"jsonl": 5},
        },
        **filled_stats().summary(total_seeds=5),
        "problems": {
            "malformed": {"count": 2, "lines": [6], "more": 1},
            "unknown_id": {"count": 0, "lines": [], "more": 0},
        },
        "exports": {
            "dpo_pairing": "one_per_seed",
            "seeds_with_pairs": 1,
            "rows": {"validated": 5, "sft": 1, "rejects": 4, "dpo": 1},
        },
    }


def test_headline_table() -> None:
    """The logged table lists totals, each label, problem lines and rows per export, aligned."""
    assert headline_table(full_summary()).splitlines() == [
        "validated                          5",
        "passed                     1 (20.0%)",
        "  missing_required                 1",
        "  contains_banned                  0",
        "  wrong_sentence_count             2",
        "  too_long                         1",
        "  other                            1",
        "problem lines                      2",
        "validated.jsonl                    5",
        "sft.jsonl                          1",
        "rejects.jsonl                      4",
        "dpo.jsonl                          1",
    ]


def test_markdown_report_sections() -> None:
    """summary.md has the headline, label, theme and split tables, problem lines with overflow, and plot links."""
    text = markdown_report(full_summary(), plots=PLOTS)
    for expected in (
        "Completions: `c.jsonl` (7 lines; 5 jsonl; sha256 `0123456789abcdef…`)",
        "| pass rate | 20.0% |",
        "| seeds with a pass | 1 / 5 |",
        "| dpo.jsonl rows | 1 |",
        "| wrong_sentence_count | 2 |",
        "| kindness | 2 | 1 | 50.0% |",
        "| val | 2 | 0 | 0.0% |",
        "| malformed | 2 | 6 (+1 more) |",
        "![sentence_counts](sentence_counts.png)",
    ):
        assert expected in text.splitlines()
    assert "| unknown_id |" not in text


def test_write_report_files(tmp_path: Path) -> None:
    """write_report writes summary.json equal to the summary, summary.md and three decodable PNGs."""
    from matplotlib.image import imread

    summary = full_summary()
    drawn = write_report(tmp_path / "report", summary)
    assert drawn == PLOTS
    assert json.loads((tmp_path / "report" / "summary.json").read_text()) == summary
    assert (tmp_path / "report" / "summary.md").read_text() == markdown_report(summary, plots=PLOTS)
    for file in PLOTS.values():
        data = (tmp_path / "report" / file).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        height, width = imread(tmp_path / "report" / file).shape[:2]
        assert width == 700 and height >= 200
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == sorted(
        ["summary.json", "summary.md", *PLOTS.values()]
    )


def test_write_report_without_plots(tmp_path: Path) -> None:
    """plots=false writes only summary.json and summary.md, and the markdown links no images."""
    assert write_report(tmp_path, full_summary(), plots=False) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "summary.md"]
    assert "![" not in (tmp_path / "summary.md").read_text()


def test_plots_with_nothing_validated(tmp_path: Path) -> None:
    """A run where no completion was usable still draws its (empty) plots."""
    summary = {**full_summary(), **ValidationStats().summary(total_seeds=0)}
    write_report(tmp_path, summary)
    assert all((tmp_path / file).read_bytes().startswith(PNG_SIGNATURE) for file in PLOTS.values())


def test_plotting_leaves_pyplot_alone() -> None:
    """Plots are drawn on an Agg canvas without importing pyplot or switching the global backend."""
    code = (
        "import sys, tempfile, pathlib, matplotlib\n"
        "before = matplotlib.rcParams._get_backend_or_none()\n"
        "from storyforge.tasks.tinystories.report import ValidationStats, write_report\n"
        "summary = {**ValidationStats().summary(total_seeds=0), 'problems': {}, 'exports': {}}\n"
        "write_report(pathlib.Path(tempfile.mkdtemp()), summary)\n"
        "print('matplotlib.pyplot' in sys.modules, matplotlib.rcParams._get_backend_or_none() == before)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_stage_logs_headline_and_writes_report(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """process_completions logs the headline table through logging and writes report/ beside the exports."""
    seed = {
        "id": "s1",
        "split": "train",
        "protagonist": "Tim",
        "theme": "honesty",
        "required": ["red ball", "old tree"],
        "banned": [],
        "min_sentences": 2,
        "max_sentences": 3,
        "instruction": "Write.",
    }
    (tmp_path / "prompts_seed.jsonl").write_text(json.dumps(seed) + "\n")
    (tmp_path / "completions.jsonl").write_text(
        json.dumps({"id": "s1", "output": "A red ball. An old tree."}) + "\n"
    )
    with caplog.at_level(logging.INFO, logger="storyforge.tasks.tinystories.outputs"):
        summary = process_completions(
            export_options(None),
            tmp_path / "out",
            tmp_path / "prompts_seed.jsonl",
            None,
            tmp_path / "completions.jsonl",
        )
    assert headline_table(summary) in caplog.text
    assert summary["by_theme"] == {"honesty": {"validated": 1, "passed": 1, "pass_rate": 1.0}}
    assert json.loads((tmp_path / "out" / "report" / "summary.json").read_text()) == summary
    assert summary["files"]["sentence_counts"] == "report/sentence_counts.png"
    assert (tmp_path / "out" / summary["files"]["sentence_counts"]).exists()


def _drawn(fig: Any) -> Any:
    """A figure drawn on an Agg canvas; returns its renderer for measuring extents."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_empty_outputs_are_counted_as_zero_sentences() -> None:
    """An empty text output lands in the histogram at 0 sentences; a provider error (no text) does not."""
    stats = filled_stats()
    for output in ("", None):
        stats.add(
            seed_id="d",
            theme="courage",
            split="train",
            bounds=(3, 9),
            result=result(("other",), count=0),
            output=output,
            finish_reason=None,
        )
    histogram = stats.summary(total_seeds=5)["sentence_counts"]["histogram"]
    assert histogram["0"] == {"below": 1, "within": 0, "above": 0}
    assert sum(sum(row.values()) for row in histogram.values()) == 5


def test_sentence_legend_never_covers_a_bar() -> None:
    """The legend sits outside the axes: no bar, however tall, is under it, and bars fit the axes."""
    summary = filled_stats().summary(total_seeds=5)
    summary["sentence_counts"]["histogram"]["9"] = {"below": 0, "within": 40, "above": 0}
    fig = sentence_figure(summary)
    renderer = _drawn(fig)
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    axes_box = ax.get_window_extent(renderer)
    bars = [patch.get_window_extent(renderer) for patch in ax.patches if patch.get_height() > 0]
    assert len(bars) == 4
    for bar in bars:
        assert not bar.overlaps(legend)
        assert bar.y1 <= axes_box.y1
    assert legend.x0 >= axes_box.x1


def test_label_names_do_not_overlap() -> None:
    """The failure-label names, however long, are drawn without overlapping one another."""
    fig = label_figure(filled_stats().summary(total_seeds=5))
    renderer = _drawn(fig)
    ticks = [t.get_window_extent(renderer) for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert len(ticks) == 5
    for i, a in enumerate(ticks):
        assert a.x0 >= 0
        for b in ticks[i + 1 :]:
            assert not a.overlaps(b)
