"""The validation report: counts gathered while streaming, then summary.json, summary.md, plots.

Takes: one :meth:`ValidationStats.add` call per validated completion (its seed's theme,
split and sentence bounds, the :class:`ValidationResult`, the output length), one
:meth:`ValidationStats.add_judge` call per judged answer (every attempt), or the stats of
several shards summed with :meth:`ValidationStats.update`. Gives:
:meth:`ValidationStats.summary` (the JSON-ready numbers), :func:`write_report` (the
``report/`` folder: ``summary.json``, ``summary.md`` and PNG plots drawn with matplotlib's
Agg canvas, never pyplot, so no global backend is touched) and :func:`headline_table`
(the lines the run logs). Why: pass rates by theme, the label mix and where sentence counts
fall against their bounds are what one reads first to decide whether a prompt or a model
needs work.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge.atomic import write_json_atomic, write_text_atomic
from storyforge.extras import require
from storyforge.quality.figures import (
    OPENINGS_PLOT,
    PLOTS,
    draw,
    label_figure,
    sentence_figure,
    theme_figure,
)
from storyforge.quality.report import diversity_markdown
from storyforge.tasks.tinystories.validate import LABELS, ValidationResult

__all__ = [
    "OPENINGS_PLOT",
    "PLOTS",
    "ValidationStats",
    "headline_table",
    "judge_markdown",
    "label_figure",
    "markdown_report",
    "sentence_figure",
    "theme_figure",
    "write_report",
]


def _rate(passed: int, total: int) -> float | None:
    return round(passed / total, 4) if total else None


def _percentile(sorted_values: list[int], q: float) -> int | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _count(table: dict[str, list[int]], key: str, validated: int, passed: int) -> None:
    """Add to ``table[key]``'s ``[validated, passed]`` (a new key starts at zero)."""
    row = table.get(key)
    if row is None:
        row = table[key] = [0, 0]
    row[0] += validated
    row[1] += passed


@dataclass(slots=True)
class ValidationStats:
    """Running counts over validated completions (memory: one small entry per seed)."""

    validated: int = 0
    passed: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    themes: dict[str, list[int]] = field(default_factory=dict)
    splits: dict[str, list[int]] = field(default_factory=dict)
    # (sentence_count, "below" | "within" | "above") -> completions; text outputs only,
    # empty ones included.
    sentences: Counter[tuple[int, str]] = field(default_factory=Counter)
    bounds: Counter[tuple[int, int]] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    chars: array[int] = field(default_factory=lambda: array("q"))
    seeds: dict[str, list[int]] = field(default_factory=dict)
    # The judge's verdicts (pass / fail / error), the rules failing verdicts cite, error kinds.
    judge: Counter[str] = field(default_factory=Counter)
    judge_rules: Counter[str] = field(default_factory=Counter)
    judge_errors: Counter[str] = field(default_factory=Counter)

    def add_judge(self, verdict: Mapping[str, Any]) -> None:
        """Count one judged answer's verdict record (``verdict``/``rule`` or ``error``)."""
        from storyforge.tasks.tinystories.judge import error_kind

        error = verdict.get("error")
        if error is not None:
            self.judge["error"] += 1
            self.judge_errors[error_kind(str(error))] += 1
        elif verdict.get("verdict") == "fail":
            self.judge["fail"] += 1
            self.judge_rules[str(verdict.get("rule", ""))] += 1
        else:
            self.judge["pass"] += 1

    def add(
        self,
        *,
        seed_id: str,
        theme: str,
        split: str,
        bounds: tuple[int, int],
        result: ValidationResult,
        output: object,
        finish_reason: str | None,
    ) -> None:
        ok = int(result.passed)
        self.validated += 1
        self.passed += ok
        self.labels.update(result.labels)
        for table, key in ((self.themes, theme), (self.splits, split), (self.seeds, seed_id)):
            _count(table, key, 1, ok)
        # Empty and whitespace-only texts count as 0 sentences; provider errors carry no text.
        if isinstance(output, str):
            count = result.sentence_count
            where = "below" if count < bounds[0] else "above" if count > bounds[1] else "within"
            self.sentences[(count, where)] += 1
            self.bounds[bounds] += 1
            self.chars.append(len(output))
        if finish_reason is not None:
            self.finish_reasons[finish_reason] += 1

    def update(self, other: ValidationStats) -> None:
        """Add the counts of ``other`` (another shard's completions) to these."""
        self.validated += other.validated
        self.passed += other.passed
        self.labels.update(other.labels)
        for table, rows in (
            (self.themes, other.themes),
            (self.splits, other.splits),
            (self.seeds, other.seeds),
        ):
            for key, (validated, passed) in rows.items():
                _count(table, key, validated, passed)
        self.sentences.update(other.sentences)
        self.bounds.update(other.bounds)
        self.finish_reasons.update(other.finish_reasons)
        self.chars.extend(other.chars)
        self.judge.update(other.judge)
        self.judge_rules.update(other.judge_rules)
        self.judge_errors.update(other.judge_errors)

    def summary(self, *, total_seeds: int) -> dict[str, Any]:
        """The numbers of summary.json (without the problem and export sections)."""
        chars = sorted(self.chars)
        histogram: dict[str, dict[str, int]] = {}
        for (count, where), n in sorted(self.sentences.items()):
            histogram.setdefault(str(count), {"below": 0, "within": 0, "above": 0})[where] = n
        judge = (
            {
                "judge": {
                    "verdicts": {k: self.judge.get(k, 0) for k in ("pass", "fail", "error")},
                    "rules": dict(sorted(self.judge_rules.items())),
                    "errors": dict(sorted(self.judge_errors.items())),
                }
            }
            if self.judge
            else {}
        )
        return {
            "validated": self.validated,
            "passed": self.passed,
            "failed": self.validated - self.passed,
            "pass_rate": _rate(self.passed, self.validated),
            "labels": {label: self.labels.get(label, 0) for label in LABELS},
            "by_theme": {
                theme: {"validated": row[0], "passed": row[1], "pass_rate": _rate(row[1], row[0])}
                for theme, row in sorted(self.themes.items())
            },
            "by_split": {
                split: {"validated": row[0], "passed": row[1], "pass_rate": _rate(row[1], row[0])}
                for split, row in sorted(self.splits.items())
            },
            "sentence_counts": {
                "histogram": histogram,
                "bounds": {f"{lo}..{hi}": n for (lo, hi), n in sorted(self.bounds.items())},
            },
            "chars": {
                "mean": round(sum(chars) / len(chars), 1) if chars else None,
                "p50": _percentile(chars, 0.5),
                "p95": _percentile(chars, 0.95),
                "max": chars[-1] if chars else None,
            },
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "seeds": {
                "total": total_seeds,
                "with_completions": len(self.seeds),
                "with_pass": sum(1 for row in self.seeds.values() if row[1]),
                "without_completions": total_seeds - len(self.seeds),
            },
            **judge,
        }


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def headline_table(summary: Mapping[str, Any]) -> str:
    """A fixed-width table of the headline numbers, for the log."""
    rows = [
        ("validated", str(summary["validated"])),
        ("passed", f"{summary['passed']} ({_pct(summary['pass_rate'])})"),
        *((f"  {label}", str(n)) for label, n in summary["labels"].items()),
        ("problem lines", str(sum(p["count"] for p in summary.get("problems", {}).values()))),
        *((f"{name}.jsonl", str(n)) for name, n in summary.get("exports", {}).get("rows", {}).items()),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value:>12}" for name, value in rows)


def _source_line(source: Mapping[str, Any]) -> str:
    formats = ", ".join(f"{n} {name}" for name, n in source.get("formats", {}).items()) or "no records"
    return (
        f"Completions: `{source.get('file', '?')}` ({source.get('lines', 0)} lines; {formats}; "
        f"sha256 `{str(source.get('sha256', ''))[:16]}…`)"
    )


def markdown_report(summary: Mapping[str, Any], *, plots: Mapping[str, str]) -> str:
    """summary.md: headline, labels, themes, splits, problems, plots."""
    out = [
        "# TinyStories validation report",
        "",
        _source_line(summary.get("source", {})),
        "",
        "| metric | value |",
        "|---|---:|",
        f"| validated | {summary['validated']} |",
        f"| passed | {summary['passed']} |",
        f"| failed | {summary['failed']} |",
        f"| pass rate | {_pct(summary['pass_rate'])} |",
        f"| seeds with a pass | {summary['seeds']['with_pass']} / {summary['seeds']['total']} |",
    ]
    for name, n in summary.get("exports", {}).get("rows", {}).items():
        out.append(f"| {name}.jsonl rows | {n} |")
    out += ["", "## Failure labels", "", "| label | completions |", "|---|---:|"]
    out += [f"| {label} | {n} |" for label, n in summary["labels"].items()]
    for title, key, column in (
        ("Pass rate by theme", "by_theme", "theme"),
        ("By split", "by_split", "split"),
    ):
        out += [
            "",
            f"## {title}",
            "",
            f"| {column} | validated | passed | pass rate |",
            "|---|---:|---:|---:|",
        ]
        out += [
            f"| {name} | {row['validated']} | {row['passed']} | {_pct(row['pass_rate'])} |"
            for name, row in summary[key].items()
        ]
    problems = summary.get("problems", {})
    out += ["", "## Problem lines", ""]
    if not any(p["count"] for p in problems.values()):
        out.append("None.")
    else:
        out += ["| kind | count | lines |", "|---|---:|---|"]
        for kind, p in problems.items():
            if p["count"]:
                lines = ", ".join(map(str, p["lines"])) + (f" (+{p['more']} more)" if p["more"] else "")
                out.append(f"| {kind} | {p['count']} | {lines} |")
        out += ["", "Every problem line is listed in `completion_errors.jsonl`."]
    if "judge" in summary:
        out += ["", judge_markdown(summary["judge"])]
    out += diversity_markdown(summary)  # dedup/diversity sections (storyforge.quality.report)
    if "cost" in summary:
        out += ["", _cost_markdown(summary["cost"]).rstrip("\n")]
    if "regeneration" in summary:
        from storyforge.tasks.tinystories.attempts import attempts_markdown

        out += ["", attempts_markdown(summary["regeneration"]).rstrip("\n")]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{name}]({file})" for name, file in plots.items()]
    return "\n".join(out) + "\n"


def judge_markdown(judge: Mapping[str, Any]) -> str:
    """The report's judge section: verdicts of every judged answer, the rules cited, the errors."""
    verdicts = judge["verdicts"]
    out = [
        "## Judge",
        "",
        f"{sum(verdicts.values())} judged answer(s) (every attempt): "
        + ", ".join(f"{k} {n}" for k, n in verdicts.items())
        + ".",
    ]
    for title, key in (("rule cited by a fail", "rules"), ("judge error", "errors")):
        rows = judge.get(key) or {}
        if rows:
            out += ["", f"| {title} | answers |", "|---|---:|"]
            out += [f"| {name or '(none)'} | {n} |" for name, n in rows.items()]
    return "\n".join(out)


def _cost_markdown(cost: Mapping[str, Any]) -> str:
    """The report's cost section: tokens and USD per stage, and per passing sample."""
    price = cost["price_per_million"]
    lines = [
        "## Cost",
        "",
        (
            f"Model `{cost['model']}`; USD per million tokens: input {price['input']:g}, "
            f"cached input {price['cached_input']:g}, output {price['output']:g}."
        ),
        "",
        "| stage | prompt tokens | completion tokens | USD |",
        "|---|---:|---:|---:|",
    ]
    for stage, row in cost["stages"].items():
        tokens = row["tokens"]
        if tokens["prompt"] or tokens["completion"]:
            lines.append(f"| {stage} | {tokens['prompt']} | {tokens['completion']} | {row['cost_usd']:.4f} |")
    per = cost["per_passing_sample_usd"]
    lines += [
        "",
        f"Total ${cost['total_usd']:.4f}; per passing sample "
        + ("n/a (none passed)" if per is None else f"${per:.6f}")
        + " (every answer in the run's journals, priced; the manifest's `cost.this_run` says what "
        + "this run sent and paid, answers from the response cache costing nothing).",
    ]
    return "\n".join(lines) + "\n"


def write_report(report_dir: Path, summary: Mapping[str, Any], *, plots: bool = True) -> dict[str, str]:
    """Write summary.json, summary.md and (if ``plots``) the PNGs; returns the plot files."""
    report_dir.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, str] = {}
    if plots:
        require("matplotlib", extra="plots", for_what="the report's plots (export.plots=false skips them)")
        drawn = draw(summary, report_dir)
    write_json_atomic(report_dir / "summary.json", summary)
    write_text_atomic(report_dir / "summary.md", markdown_report(summary, plots=drawn))
    return drawn
