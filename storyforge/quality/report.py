"""The dedup and diversity sections of a run report, in Markdown (their plot, how many
outputs start with each of the most common openings, is :mod:`storyforge.quality.figures`).

Takes: a run summary holding ``dedup`` and ``diversity`` (see
:mod:`storyforge.tasks.tinystories.dedup_stage`). Gives: :func:`diversity_markdown` (lines
for summary.md), and the sweep report's diversity table and figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_METRIC",
    "METRICS",
    "diversity_markdown",
    "sweep_figures",
    "sweep_markdown",
]

METRICS = (
    "distinct_1",
    "distinct_2",
    "distinct_3",
    "compression_ratio",
    "self_bleu",
    "top_openings_share",
    "exact_duplicate_rate",
    "near_duplicate_rate",
    "duplicate_rate",
)
"""The per-group figures, in the order tables show them."""

DEFAULT_METRIC = "distinct_2"
"""The figure a sweep report's heatmaps draw beside the pass rate unless told otherwise."""


def sweep_figures(completions: Mapping[str, Any]) -> dict[str, Any]:
    """The run-level :data:`METRICS` of a job's ``completions`` summary (empty without them)."""
    run = (completions.get("diversity") or {}).get("run") or {}
    return {metric: run.get(metric) for metric in METRICS} if run else {}


def sweep_markdown(jobs: list[Mapping[str, Any]]) -> list[str]:
    """sweep_report.md lines: a column per diversity figure, a row per job that has them."""
    rows = [job for job in jobs if job.get("diversity")]
    if not rows:
        return []
    out = ["", "## Diversity per job", "", "Definitions: docs/diversity.md.", ""]
    out += ["| job | " + " | ".join(METRICS) + " |", "|---|" + "---:|" * len(METRICS)]
    for job in rows:
        out.append(f"| {job['job']} | " + " | ".join(_fmt(job["diversity"].get(m)) for m in METRICS) + " |")
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def diversity_markdown(summary: Mapping[str, Any]) -> list[str]:
    """summary.md lines: the figures per run/theme/split, repeats and their attribution."""
    diversity = summary.get("diversity")
    if not diversity:
        return []
    out = ["", "## Diversity", "", "Definitions: docs/diversity.md.", ""]
    out += ["| group | outputs | " + " | ".join(METRICS) + " |", "|---|---:|" + "---:|" * len(METRICS)]
    rows = [("run", diversity["run"])]
    rows += [(f"theme {name}", row) for name, row in diversity["by_theme"].items()]
    rows += [(f"split {name}", row) for name, row in diversity["by_split"].items()]
    for name, row in rows:
        out.append(f"| {name} | {row['outputs']} | " + " | ".join(_fmt(row[m]) for m in METRICS) + " |")
    top = diversity["run"]["top_openings"][:5]
    if top:
        out += ["", "Most common openings: " + "; ".join(f'"{o["opening"]}" ({o["count"]})' for o in top)]
    grams = diversity["run"]["repeated_4grams"][:5]
    if grams:
        out += ["", "Most repeated 4-grams: " + "; ".join(f'"{g["ngram"]}" ({g["texts"]})' for g in grams)]
    dedup = summary.get("dedup") or {}
    if dedup.get("enabled"):
        out += [
            "",
            "## Repeats",
            "",
            (
                f"{dedup['dropped']} of {dedup['texts']} outputs dropped as repeats "
                f"({dedup['exact_duplicates']} exact, {dedup['near_duplicates']} near, "
                f"{dedup['against_duplicates']} already in an earlier dataset) "
                f"in {dedup['clusters']} clusters; see `{dedup['file']}`."
            ),
        ]
        for name, values in dedup["by_field"].items():
            worst = [v for v in values if v["duplicates"]][:3]
            if worst:
                listed = ", ".join(f"{v['value']} {v['rate']:.1%} of {v['outputs']}" for v in worst)
                out.append(f"- highest duplicate rate by {name}: {listed}")
    return out
