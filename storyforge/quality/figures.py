"""The report's figures: a run summary -> matplotlib Figures -> PNG files in ``report/``.

Takes: the summary of a TinyStories run (:mod:`storyforge.tasks.tinystories.report`; the
openings plot reads its ``diversity`` section, :mod:`storyforge.tasks.tinystories.dedup_stage`).
Gives: one function per figure, and :func:`draw`, which saves them as PNGs (matplotlib's Agg
canvas, never pyplot, so no global backend is touched; no date in the file) and returns
the files drawn.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storyforge.atomic import write_bytes_atomic
from storyforge.quality.text import OPENING_WORD, cut

__all__ = [
    "OPENINGS_PLOT",
    "PLOTS",
    "draw",
    "label_figure",
    "openings_figure",
    "save_png",
    "sentence_figure",
    "theme_figure",
]

PLOTS = {
    "pass_rate_by_theme": "pass_rate_by_theme.png",
    "label_counts": "label_counts.png",
    "sentence_counts": "sentence_counts.png",
}
OPENINGS_PLOT = "openings.png"
"""Drawn when the summary has a ``diversity`` section."""


def save_png(fig: Any, path: Path) -> None:
    """``fig`` as a PNG at ``path``, atomically, with no date or software in the file (the same
    bytes for the same figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    write_bytes_atomic(path, buffer.getvalue())


def theme_figure(summary: Mapping[str, Any]) -> Any:
    """Pass rate per theme, one horizontal bar each, with the rate and count beside it."""
    from matplotlib.figure import Figure

    themes = summary["by_theme"]
    height = 0.4 * max(len(themes), 3) + 1.2
    fig = Figure(figsize=(7, height))
    # Fixed margins: a layout engine costs as much again as drawing.
    fig.subplots_adjust(left=0.2, right=0.97, top=1 - 0.45 / height, bottom=0.55 / height)
    ax = fig.add_subplot()
    names = list(themes)
    rates = [100 * (themes[n]["pass_rate"] or 0.0) for n in names]
    ax.barh(names, rates, color="#4c72b0")
    for y, (name, rate) in enumerate(zip(names, rates, strict=True)):
        note = f"{rate:.0f}%  n={themes[name]['validated']}"
        ax.text(min(rate + 1, 80), y, note, va="center", fontsize=8)
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("pass rate (%)")
    ax.set_title("Pass rate by theme")
    return fig


def label_figure(summary: Mapping[str, Any]) -> Any:
    """Completions per failure label; horizontal bars, so long label names never overlap."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    labels = summary["labels"]
    height = 0.4 * max(len(labels), 3) + 1.2
    fig = Figure(figsize=(7, height))
    fig.subplots_adjust(left=0.27, right=0.95, top=1 - 0.45 / height, bottom=0.55 / height)
    ax = fig.add_subplot()
    values = list(labels.values())
    ax.barh(list(labels), values, color="#dd8452")
    ax.invert_yaxis()
    ax.set_xlim(0, max([*values, 1]) * 1.15)
    for y, n in enumerate(values):
        ax.text(n, y, f" {n}", va="center", fontsize=8)
    ax.set_xlabel("completions")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Failure labels (a completion can carry several)")
    return fig


def sentence_figure(summary: Mapping[str, Any]) -> Any:
    """Sentence counts of text outputs (0 = empty), stacked by where they fall against their bounds.

    The legend sits outside the axes, so it can never cover a bar.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 3.5))
    fig.subplots_adjust(left=0.1, right=0.76, top=0.9, bottom=0.15)
    ax = fig.add_subplot()
    hist = summary["sentence_counts"]["histogram"]
    counts = [int(c) for c in hist]
    bottom = [0] * len(counts)
    for where, color in (("within", "#55a868"), ("below", "#c44e52"), ("above", "#8172b3")):
        values = [hist[str(c)][where] for c in counts]
        ax.bar(counts, values, bottom=bottom, color=color, label=f"{where} bounds")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylim(0, max([*bottom, 1]) * 1.1)
    bounds = summary["sentence_counts"]["bounds"]
    if bounds:
        common = max(bounds, key=lambda k: bounds[k])
        lo, hi = (int(x) for x in common.split(".."))
        for x in (lo - 0.5, hi + 0.5):
            ax.axvline(x, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"Sentence counts (dashed: most common bounds {lo}..{hi})")
    else:
        ax.set_title("Sentence counts")
    ax.set_xlabel("sentences (0: empty output)")
    ax.set_ylabel("completions")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if counts:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def openings_figure(diversity: Mapping[str, Any]) -> Any:
    """Horizontal bars: outputs per opening (first five words), most common first."""
    from matplotlib.figure import Figure

    top = diversity["run"]["top_openings"]
    height = 0.3 * max(len(top), 3) + 1.4
    fig = Figure(figsize=(8, height))
    ax = fig.add_axes((0.42, 0.8 / height, 0.54, 1 - 1.2 / height))
    # a summary written by another version may hold an uncut opening: drawing it is slow
    labels = [cut(o["opening"], 5 * (OPENING_WORD + 1)) or "(empty)" for o in reversed(top)]
    counts = [o["count"] for o in reversed(top)]
    ax.barh(range(len(top)), counts, color="#4c72b0")
    ax.set_yticks(range(len(top)), labels, fontsize=8)
    share = diversity["run"]["top_openings_share"]
    ax.set_xlabel("outputs (diversity sample)")
    texts = diversity["run"].get("texts")
    title = (
        f"Openings shared by two or more outputs: {share:.1%} of {texts} outputs (top {len(top)} shown)"
        if share is not None
        else "No text outputs"
    )
    ax.set_title(title, fontsize=10)
    return fig


def draw(summary: Mapping[str, Any], report_dir: Path) -> dict[str, str]:
    """Save every figure of ``summary`` in ``report_dir``; returns the plot names -> files."""
    save_png(theme_figure(summary), report_dir / PLOTS["pass_rate_by_theme"])
    save_png(label_figure(summary), report_dir / PLOTS["label_counts"])
    save_png(sentence_figure(summary), report_dir / PLOTS["sentence_counts"])
    if "diversity" not in summary:
        return dict(PLOTS)
    save_png(openings_figure(summary["diversity"]), report_dir / OPENINGS_PLOT)
    return {**PLOTS, "openings": OPENINGS_PLOT}
