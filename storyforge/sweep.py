"""Sweep summary and report: after ``python run.py -m ...``, every job side by side.

Takes: the sweep directory Hydra wrote (one sub-directory per job, each with
``.hydra/overrides.yaml``, ``job_status.json`` and, when the job finished, ``manifest.json``).
Gives: :class:`SweepSummary`, a Hydra callback (configured under ``hydra.callbacks`` in
``conf/config.yaml``), :func:`summarize_sweep` (``sweep_summary.json``/``.md``: one row of
counts per job) and :func:`write_sweep` (the summary plus the report of
:mod:`storyforge.sweep_report`), which ``storyforge report SWEEP_DIR`` also calls.

Why: comparing the jobs of a sweep should not need a notebook, and a failed job must stay
visible. ``on_job_end`` records each job's outcome (and a failure's error) in its own
directory, in whatever process ran it. Hydra 1.3's sweeper re-raises the first failed job
before ``on_multirun_end`` is called, so the callback also registers an exit handler in
``on_multirun_start`` that writes the summary and report if ``on_multirun_end`` never ran;
the app still exits non-zero.
"""

from __future__ import annotations

import atexit
import json
import logging
from pathlib import Path
from typing import Any

import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from storyforge.atomic import write_json_atomic, write_text_atomic
from storyforge.errors import DataError
from storyforge.quality.report import DEFAULT_METRIC, sweep_figures
from storyforge.redaction import redact
from storyforge.runfiles import MANIFEST, SWEEP_REPORT_MD, SWEEP_SUMMARY, SWEEP_SUMMARY_MD

__all__ = [
    "STATUS_FILE",
    "SweepSummary",
    "summarize_sweep",
    "write_job_status",
    "write_sweep",
]


log = logging.getLogger(__name__)

STATUS_FILE = "job_status.json"


class SweepSummary(Callback):
    """Hydra callback: record each job's outcome; write the summary and report when the sweep ends."""

    def __init__(self, plots: bool = True, metric: str = DEFAULT_METRIC) -> None:
        self.plots = plots
        self.metric = metric
        self._root: Path | None = None
        self._written = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._root = Path(config.hydra.sweep.dir)
        self._written = False
        atexit.register(self._at_exit)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            write_job_status(Path(config.hydra.runtime.output_dir), job_return)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._write(Path(config.hydra.sweep.dir))

    def _at_exit(self) -> None:
        # Only reached without on_multirun_end when a job failed (see the module docstring).
        if not self._written and self._root is not None:
            self._write(self._root)

    def _write(self, root: Path) -> None:
        self._written = True
        if not root.is_dir() or not any(root.glob("*/.hydra")):
            return  # no job started (Hydra refused the sweep's config and said why)
        summary = write_sweep(root, plots=self.plots, metric=self.metric)
        failed = [job["job"] for job in summary["jobs"] if job["status"] != "ok"]
        log.info("sweep report of %d job(s): %s", len(summary["jobs"]), root / SWEEP_REPORT_MD)
        if failed:
            log.error(
                "%d job(s) without a result: %s (see %s)",
                len(failed),
                ", ".join(f"job {job}" for job in failed),
                root / SWEEP_REPORT_MD,
            )


def write_job_status(job_dir: Path, job_return: JobReturn) -> dict[str, Any]:
    """Write ``job_status.json`` (``status``, and ``error`` for a failed job) into ``job_dir``."""
    record: dict[str, Any] = {"status": "completed", "error": None}
    if job_return.status == JobStatus.FAILED:
        exc = job_return._return_value  # the job's exception (return_value would print and raise it)
        record = {"status": "failed", "error": redact(f"{type(exc).__name__}: {exc}")}
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(job_dir / STATUS_FILE, record)
    return record


def write_sweep(root: Path, *, plots: bool = True, metric: str = DEFAULT_METRIC) -> dict[str, Any]:
    """Rebuild the summary and the report of the sweep at ``root`` from its job directories
    (``metric``: the diversity figure drawn beside the pass rate in each heatmap)."""
    from storyforge.sweep_report import write_report

    summary = summarize_sweep(root)
    write_report(root, summary, plots=plots, metric=metric)
    from storyforge.card import write_sweep_card

    write_sweep_card(root, summary)  # README.md: the sweep as a list of datasets
    return summary


def summarize_sweep(root: Path) -> dict[str, Any]:
    """Read every job directory under ``root``; write and return the summary.

    Raises :class:`DataError` when ``root`` is not a directory or holds no job directories.
    """
    if not root.is_dir():
        raise DataError(f"sweep directory {root} does not exist")
    jobs: list[dict[str, Any]] = []
    columns: list[str] = []
    for job_dir in sorted((p for p in root.iterdir() if (p / ".hydra").is_dir()), key=_job_order):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text("utf-8")) if overrides_file.is_file() else []
        row: dict[str, Any] = {"job": job_dir.name, "overrides": list(overrides or [])}
        manifest_file = job_dir / MANIFEST
        status_file = job_dir / STATUS_FILE
        status = json.loads(status_file.read_text("utf-8")) if status_file.is_file() else {}
        if status.get("status") == "failed":
            row.update(status="failed", counts={}, error=status.get("error"))
        elif manifest_file.is_file():
            manifest = json.loads(manifest_file.read_text("utf-8"))
            counts = _flatten(manifest.get("counts", {}))
            row.update(status="ok", task=manifest.get("task"), config_sha256=manifest.get("config_sha256"))
            row["counts"] = counts
            checked = manifest.get("completions")
            if isinstance(checked, dict):
                row["completions"] = {
                    key: checked.get(key) for key in ("validated", "passed", "failed", "pass_rate", "labels")
                }
                row["completions"]["diversity"] = sweep_figures(checked)  # storyforge.quality.report
                if "regeneration" in checked:  # pass rate by attempt (regenerate.max_attempts > 1)
                    row["completions"]["regeneration"] = checked["regeneration"]
            columns.extend(c for c in counts if c not in columns)
        else:
            row.update(status="missing", counts={})
        jobs.append(row)
    if not jobs:
        raise DataError(f"{root} holds no job directories (sub-directories with a .hydra folder)")
    summary = {"columns": columns, "jobs": jobs}
    write_json_atomic(root / SWEEP_SUMMARY, summary)
    write_text_atomic(root / SWEEP_SUMMARY_MD, "".join(line + "\n" for line in _markdown(summary)))
    return summary


def _markdown(summary: dict[str, Any]) -> list[str]:
    from storyforge.sweep_report import markdown_table

    columns: list[str] = summary["columns"]
    rows = [
        [
            job["job"],
            " ".join(f"`{o}`" for o in job["overrides"]) or "(none)",
            job["status"],
            *(job["counts"].get(c, "") for c in columns),
        ]
        for job in summary["jobs"]
    ]
    return markdown_table(["job", "overrides", "status", *columns], rows)


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
