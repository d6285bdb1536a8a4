"""Sweep summary: after ``python run.py -m ...``, one table of every job's counts.

Takes: the sweep directory Hydra wrote (one sub-directory per job, each with
``.hydra/overrides.yaml`` and, when the job finished, ``manifest.json``). Gives:
:class:`SweepSummary`, a Hydra callback (configured under ``hydra.callbacks`` in
``conf/config.yaml``) whose ``on_multirun_end`` writes ``sweep_summary.json`` and
``sweep_summary.md`` at the sweep root, and :func:`summarize_sweep`, which does the work.
Why: comparing the jobs of a sweep should not need a notebook; a job without a manifest is
listed as ``missing`` rather than dropped, so a failed job stays visible.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from storyforge.atomic import write_json_atomic, write_text_atomic

__all__ = ["SUMMARY_JSON", "SUMMARY_MD", "SweepSummary", "summarize_sweep"]

log = logging.getLogger(__name__)

SUMMARY_JSON = "sweep_summary.json"
SUMMARY_MD = "sweep_summary.md"


class SweepSummary(Callback):
    """Hydra callback: write the sweep summary once every job of a multirun has finished."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        if root.is_dir():
            summary = summarize_sweep(root)
            log.info("sweep summary of %d job(s): %s", len(summary["jobs"]), root / SUMMARY_MD)


def summarize_sweep(root: Path) -> dict[str, Any]:
    """Read every job directory under ``root``; write and return the summary."""
    jobs: list[dict[str, Any]] = []
    columns: list[str] = []
    for job_dir in sorted((p for p in root.iterdir() if (p / ".hydra").is_dir()), key=_job_order):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text("utf-8")) if overrides_file.is_file() else []
        row: dict[str, Any] = {"job": job_dir.name, "overrides": list(overrides or [])}
        manifest_file = job_dir / "manifest.json"
        if manifest_file.is_file():
            manifest = json.loads(manifest_file.read_text("utf-8"))
            counts = _flatten(manifest.get("counts", {}))
            row.update(status="ok", task=manifest.get("task"), config_sha256=manifest.get("config_sha256"))
            row["counts"] = counts
            columns.extend(c for c in counts if c not in columns)
        else:
            row.update(status="missing", counts={})
        jobs.append(row)
    summary = {"columns": columns, "jobs": jobs}
    write_json_atomic(root / SUMMARY_JSON, summary)
    write_text_atomic(root / SUMMARY_MD, "".join(line + "\n" for line in _markdown(summary)))
    return summary


def _markdown(summary: dict[str, Any]) -> list[str]:
    columns: list[str] = summary["columns"]
    head = ["job", "overrides", "status", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for job in summary["jobs"]:
        cells = [
            job["job"],
            " ".join(f"`{o}`" for o in job["overrides"]) or "(none)",
            job["status"],
            *(str(job["counts"].get(c, "")) for c in columns),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def _flatten(counts: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in counts.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _job_order(path: Path) -> tuple[int, int | str]:
    return (0, int(path.name)) if path.name.isdigit() else (1, path.name)
