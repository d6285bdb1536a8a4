"""Sweep report: the jobs of a multirun compared, from their summary to Markdown, JSON and PNGs.

Takes: the mapping :func:`storyforge.sweep.summarize_sweep` returns (one row per job with its
overrides, status, manifest counts, completion figures or error). Gives:
:func:`build_report` (the numbers: swept axes, per-job pass rate with a Wilson 95% interval,
labels per job, failed jobs), :func:`write_report` (``sweep_report.json``, ``sweep_report.md``
and, when completions were checked, one heatmap PNG per pair of swept axes, or a pass-rate
chart when only one axis was swept) and :func:`wilson_interval`.

Why: a sweep asks which settings a model satisfies and how it fails. A bare rate hides how
many completions it rests on, so every rate carries its interval; two axes at once are read
best as a grid; and a job that failed is listed with its error instead of vanishing.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from storyforge.atomic import write_json_atomic, write_text_atomic
from storyforge.errors import ConfigError
from storyforge.extras import require
from storyforge.quality.figures import save_png
from storyforge.quality.report import DEFAULT_METRIC, METRICS, sweep_markdown
from storyforge.runfiles import SWEEP_REPORT, SWEEP_REPORT_MD
from storyforge.tasks.tinystories.attempts import percent, wilson_interval

__all__ = [
    "build_report",
    "markdown_table",
    "swept_axes",
    "wilson_interval",
    "write_report",
]

MAX_HEATMAPS = 10


def _split_override(override: str) -> tuple[str, str] | None:
    key, sep, value = override.partition("=")
    if not sep:
        return None
    return key.lstrip("+~"), value


def _sort_values(values: list[str]) -> list[str]:
    try:
        return sorted(values, key=float)
    except ValueError:
        return values


def swept_axes(jobs: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Override keys whose value differs between jobs -> their values (numeric order when numbers)."""
    seen: dict[str, list[str]] = {}
    for job in jobs:
        for override in job["overrides"]:
            parts = _split_override(override)
            if parts is None:
                continue
            key, value = parts
            values = seen.setdefault(key, [])
            if value not in values:
                values.append(value)
    counts = {key: sum(1 for job in jobs if key in _settings(job)) for key in seen}
    return {
        key: _sort_values(values)
        for key, values in seen.items()
        if len(values) > 1 or counts[key] < len(jobs)
    }


def _settings(job: Mapping[str, Any]) -> dict[str, str]:
    return dict(p for o in job["overrides"] if (p := _split_override(o)) is not None)


def build_report(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per-job pass rates with intervals, labels, errors and the swept axes of a sweep summary."""
    jobs: list[Mapping[str, Any]] = summary["jobs"]
    axes = swept_axes(jobs)
    labels: list[str] = []
    rows: list[dict[str, Any]] = []
    for job in jobs:
        settings = _settings(job)
        checked = job.get("completions") or {}
        validated = int(checked.get("validated") or 0)
        passed = int(checked.get("passed") or 0)
        interval = wilson_interval(passed, validated)
        job_labels = dict(checked.get("labels") or {})
        labels.extend(label for label in job_labels if label not in labels)
        rows.append(
            {
                "job": job["job"],
                "status": job["status"],
                "swept": {axis: settings.get(axis) for axis in axes},
                "validated": validated if checked else None,
                "passed": passed if checked else None,
                "pass_rate": round(passed / validated, 4) if validated else None,
                "ci95": [round(interval[0], 4), round(interval[1], 4)] if interval else None,
                "labels": job_labels,
                # Regeneration: the share of chains passing by attempt 1, 2, ..., K.
                "by_attempt": [
                    row["pass_rate"] for row in (checked.get("regeneration") or {}).get("by_attempt", ())
                ],
                "diversity": dict(checked.get("diversity") or {}),
                "error": job.get("error"),
            }
        )
    return {
        "axes": axes,
        "labels": labels,
        "jobs": rows,
        "counts": {
            status: sum(1 for r in rows if r["status"] == status) for status in ("ok", "failed", "missing")
        },
        "plots": [],
    }


def _attempts_table(report: Mapping[str, Any]) -> list[str]:
    """Pass rate by attempt per job (regenerate.max_attempts > 1), swept settings as columns."""
    depth = max((len(row.get("by_attempt") or ()) for row in report["jobs"]), default=0)
    if not depth:
        return []
    axes: dict[str, list[str]] = report["axes"]
    head = [
        "job",
        *(f"`{a}`" for a in axes),
        *(f"≤{k} attempt{'s' if k > 1 else ''}" for k in range(1, depth + 1)),
    ]
    out = _section(
        "Pass rate by attempt",
        "Share of chains (a seed's sample) passing by each attempt (see report/summary.md of each job).",
    )
    rows = []
    for row in report["jobs"]:
        rates = list(row.get("by_attempt") or ())
        if not rates:
            continue
        rates += [rates[-1]] * (depth - len(rates))  # a job whose chains all ended earlier
        rows.append([row["job"], *_swept_cells(row, axes), *(percent(rate) for rate in rates)])
    return out + markdown_table(head, rows)


def _section(title: str, note: str | None = None) -> list[str]:
    """The lines that open a section of the report: its heading and the sentence under it."""
    return ["", f"## {title}", "", *([note, ""] if note else [])]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "axis"


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table: ``head`` as it is, each cell as text with ``|`` escaped and
    line breaks as spaces."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + [
        "| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in row) + " |" for row in rows
    ]


def _swept_cells(row: Mapping[str, Any], axes: Iterable[str]) -> list[str]:
    return [str(row["swept"].get(a) if row["swept"].get(a) is not None else "") for a in axes]


def markdown(report: Mapping[str, Any], root: Path) -> str:
    """sweep_report.md: overview, pass rates with intervals, plots, labels per job, failed jobs."""
    counts = report["counts"]
    axes: dict[str, list[str]] = report["axes"]
    out = [
        "# Sweep report",
        "",
        (
            f"Sweep `{root}`: {len(report['jobs'])} job(s); {counts['ok']} finished, "
            f"{counts['failed']} failed, {counts['missing']} without a result."
        ),
        "",
    ]
    if axes:
        out.append(
            "Swept: " + "; ".join(f"`{axis}` = {', '.join(values)}" for axis, values in axes.items()) + "."
        )
    else:
        out.append("No override differs between the jobs.")
    out += _section(
        "Pass rate per job", "Pass rates of the checked completions, with the 95% Wilson score interval."
    )
    head = ["job", *(f"`{a}`" for a in axes), "status", "validated", "passed", "pass rate", "95% CI"]
    rows = []
    for row in report["jobs"]:
        ci = row["ci95"]
        rows.append(
            [
                row["job"],
                *_swept_cells(row, axes),
                row["status"],
                "" if row["validated"] is None else row["validated"],
                "" if row["passed"] is None else row["passed"],
                percent(row["pass_rate"]) if row["validated"] is not None else "",
                f"{percent(ci[0])} – {percent(ci[1])}" if ci else "",
            ]
        )
    out += markdown_table(head, rows)
    if not any(row["validated"] for row in report["jobs"]):
        out += [
            "",
            "No job checked completions (set `completions=` or a `provider=`), so there are no pass rates.",
        ]
    if report["plots"]:
        out += _section("Plots")
        out += [f"![{plot['title']}]({plot['file']})" for plot in report["plots"]]
    out += _attempts_table(report)
    labels: list[str] = report["labels"]
    if labels:
        out += _section("Failure labels per job", "Completions per label (a completion can carry several).")
        rows = [
            [row["job"], *(row["labels"].get(n, 0) for n in labels)]
            for row in report["jobs"]
            if row["labels"]
        ]
        out += markdown_table(["job", *labels], rows)
    out += sweep_markdown(report["jobs"])  # a column per diversity figure (storyforge.quality.report)
    failed = [row for row in report["jobs"] if row["status"] != "ok"]
    out += _section("Failed jobs")
    if not failed:
        out.append("None.")
    else:
        unknown = "no manifest.json and no recorded error (interrupted?)"
        out += markdown_table(
            ("job", "status", "error"),
            [(row["job"], row["status"], row["error"] or unknown) for row in failed],
        )
    return "\n".join(out) + "\n"


def _cell(rows: Sequence[Mapping[str, Any]], match: Mapping[str, str]) -> list[Mapping[str, Any]]:
    """The jobs whose swept values equal ``match``."""
    return [row for row in rows if all(row["swept"].get(axis) == value for axis, value in match.items())]


def _pooled(rows: Sequence[Mapping[str, Any]], match: Mapping[str, str]) -> tuple[int, int, bool]:
    """(passed, validated, any failed job) over the jobs whose swept values equal ``match``."""
    cell = _cell(rows, match)
    passed = sum(row["passed"] or 0 for row in cell)
    validated = sum(row["validated"] or 0 for row in cell)
    return passed, validated, any(row["status"] != "ok" for row in cell)


def _metric_cell(
    rows: Sequence[Mapping[str, Any]], match: Mapping[str, str], metric: str
) -> tuple[float, int]:
    """(mean of ``metric`` over the finished jobs whose swept values equal ``match``, how many)."""
    values = [row["diversity"][metric] for row in _cell(rows, match) if _is_number(row, metric)]
    return (sum(values) / len(values) if values else math.nan), len(values)


def _is_number(row: Mapping[str, Any], metric: str) -> bool:
    return isinstance((row.get("diversity") or {}).get(metric), int | float)


def heatmap_figure(report: Mapping[str, Any], x_axis: str, y_axis: str, metric: str | None = None) -> Any:
    """Pass rate over two swept axes (jobs sharing a cell are pooled); cells say the rate, its
    Wilson 95% interval and n.

    With ``metric`` (a diversity figure some job has), a second grid beside it shows that
    figure's mean over the cell's jobs, so the trade-off between the two reads at a glance.
    """
    from matplotlib.figure import Figure

    xs, ys = report["axes"][x_axis], report["axes"][y_axis]
    cells = [[{x_axis: x, y_axis: y} for x in xs] for y in ys]
    grid: list[list[float]] = []
    notes: list[list[str]] = []
    for line in cells:
        pooled = [_pooled(report["jobs"], match) for match in line]
        grid.append([passed / validated if validated else math.nan for passed, validated, _ in pooled])
        notes.append([_rate_note(*cell) for cell in pooled])
    metrics = (
        [[_metric_cell(report["jobs"], match, metric) for match in line] for line in cells]
        if metric is not None
        else []
    )
    extra = [[value for value, _ in row] for row in metrics]
    extra_notes = [
        [f"{value:.3g}\njobs={jobs}" if jobs else "no data" for value, jobs in row] for row in metrics
    ]
    panels = [(grid, notes, "pass rate", 0.0, 1.0)]
    finite = [v for row in extra for v in row if not math.isnan(v)]
    if metric is not None and finite:
        low, high = min(finite), max(finite)
        if 0.0 <= low and high <= 1.0:  # a share or rate: its whole scale, so small gaps look small
            low, high = 0.0, 1.0
        panels.append((extra, extra_notes, metric, low, high if high > low else low + 1e-9))
    width = min(2.0 + 1.1 * len(xs), 14.0)
    height = min(1.6 + 0.7 * len(ys), 10.0)
    fig = Figure(figsize=(width * len(panels), height))
    fig.subplots_adjust(left=0.22 / len(panels), right=0.94, top=0.85, bottom=0.2, wspace=0.6)
    for index, (values, texts, label, vmin, vmax) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        image = ax.imshow(values, vmin=vmin, vmax=vmax, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(xs)), labels=xs)
        ax.set_yticks(range(len(ys)), labels=ys)
        ax.set_xlabel(x_axis)
        ax.set_ylabel(y_axis)
        middle = vmin + 0.6 * (vmax - vmin)
        for i, row in enumerate(texts):
            for j, note in enumerate(row):
                value = values[i][j]
                color = "white" if math.isnan(value) or value < middle else "black"
                ax.text(j, i, note, ha="center", va="center", fontsize=7, color=color)
        ax.set_facecolor("#bbbbbb")
        fig.colorbar(image, ax=ax, label=label)
        ax.set_title("Pass rate [95% interval]" if index == 0 else f"{metric} (mean of jobs)")
    return fig


def _rate_note(passed: int, validated: int, failed: bool) -> str:
    """A heatmap cell's text: the pooled rate, its Wilson 95% interval and n (or no data)."""
    interval = wilson_interval(passed, validated)
    note = (
        f"{100 * passed / validated:.0f}%\n[{100 * interval[0]:.0f}-{100 * interval[1]:.0f}]\nn={validated}"
        if validated and interval
        else "no data"
    )
    return note + ("\n(failed)" if failed else "")


def rate_figure(report: Mapping[str, Any], axis: str) -> Any:
    """Pass rate per value of the one swept axis, with Wilson 95% intervals as error bars."""
    from matplotlib.figure import Figure

    values = report["axes"][axis]
    rates: list[float] = []
    lows: list[float] = []
    highs: list[float] = []
    for value in values:
        passed, validated, _ = _pooled(report["jobs"], {axis: value})
        interval = wilson_interval(passed, validated)
        rate = passed / validated if validated else math.nan
        rates.append(100 * rate)
        lows.append(100 * (rate - interval[0]) if interval else 0.0)
        highs.append(100 * (interval[1] - rate) if interval else 0.0)
    fig = Figure(figsize=(min(2.5 + 0.8 * len(values), 14.0), 3.5))
    fig.subplots_adjust(left=0.12, right=0.97, top=0.88, bottom=0.18)
    ax = fig.add_subplot()
    positions = list(range(len(values)))
    ax.bar(positions, rates, color="#4c72b0", yerr=[lows, highs], capsize=4)
    ax.set_xticks(positions, labels=values)
    ax.set_ylim(0, 105)
    ax.set_xlabel(axis)
    ax.set_ylabel("pass rate (%)")
    ax.set_title("Pass rate (bars: 95% Wilson interval)")
    return fig


def write_report(
    root: Path, summary: Mapping[str, Any], *, plots: bool = True, metric: str = DEFAULT_METRIC
) -> dict[str, Any]:
    """Write sweep_report.json, sweep_report.md and the plots at ``root``; returns the report.

    ``metric``: the diversity figure each heatmap shows beside the pass rate (see
    :data:`storyforge.quality.report.METRICS`).
    """
    if metric not in METRICS:
        raise ConfigError(f"sweep report metric must be one of {', '.join(METRICS)}, got {metric!r}")
    report = build_report(summary)
    axes = list(report["axes"])
    if plots and any(row["validated"] for row in report["jobs"]):
        require("matplotlib", extra="plots", for_what="the sweep report's plots")
        if len(axes) == 1:
            name = f"sweep_pass_rate_{_slug(axes[0])}.png"
            save_png(rate_figure(report, axes[0]), root / name)
            report["plots"].append({"title": f"pass rate by {axes[0]}", "file": name, "axes": axes})
        for x_axis, y_axis in itertools.islice(itertools.combinations(axes, 2), MAX_HEATMAPS):
            name = f"sweep_heatmap_{_slug(x_axis)}__{_slug(y_axis)}.png"
            save_png(heatmap_figure(report, x_axis, y_axis, metric), root / name)
            report["plots"].append(
                {"title": f"pass rate: {x_axis} x {y_axis}", "file": name, "axes": [x_axis, y_axis]}
            )
    write_json_atomic(root / SWEEP_REPORT, report)
    write_text_atomic(root / SWEEP_REPORT_MD, markdown(report, root))
    return report
