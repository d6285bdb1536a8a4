"""The research-QA job: config -> one condition's exports, its Modelfile, or a drift check.

Takes: the run's settings (``task=research_qa``, see :mod:`storyforge.config.settings`) and
the Hydra run directory. Gives, by
``stage``:

- ``export`` (default): ``train.jsonl``, ``eval.jsonl``, ``rejected.jsonl`` and
  ``manifest.json`` of the condition (``model`` x ``task.prompt_mode``) in the run directory;
- ``modelfiles``: ``Modelfile.<model_type>`` in ``task.modelfiles_dir`` (or the run directory);
- ``check``: every validator over the prompt format itself, ``task.check.artifacts`` and
  ``task.check.modelfiles``; drift raises :class:`~storyforge.errors.DataError` (exit 1);
- ``all``: export, Modelfile and check of the run directory, in that order.

Returns the manifest (export) or a summary mapping. Why a thin module: the work lives in
:mod:`storyforge.tasks.research_qa` so the library, the CLI and this job share it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path

from storyforge.config.research_qa import ResearchQASettings
from storyforge.config.settings import RunSettings
from storyforge.errors import DataError
from storyforge.jobs.base import OneUnitJob, Report

__all__ = ["ResearchQAResult", "ResearchQAUnit", "run", "run_unit"]

log = logging.getLogger(__name__)


def run(run_settings: RunSettings, out_dir: Path) -> OneUnitJob[ResearchQAUnit, ResearchQAResult]:
    """The research-QA job: its one unit does the configured stage in ``out_dir``.

    Paths the config names relative to where the run started are made absolute here, on the
    driver, so the unit does the same wherever it runs."""
    settings = run_settings.task
    assert isinstance(settings, ResearchQASettings)
    target = settings.task.modelfiles_dir
    unit = ResearchQAUnit(
        settings=settings,
        out_dir=Path(out_dir),
        modelfiles_dir=Path(to_absolute_path(target)) if target else Path(out_dir),
        artifacts=tuple(Path(to_absolute_path(p)) for p in settings.task.check.artifacts),
        modelfiles=tuple(_absolute_spec(s) for s in settings.task.check.modelfiles),
    )
    return OneUnitJob(name="research_qa", unit=unit, run=run_unit, done=_done)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResearchQAUnit:
    """One research-QA stage, with every path absolute."""

    settings: ResearchQASettings
    out_dir: Path
    modelfiles_dir: Path
    artifacts: tuple[Path, ...]
    modelfiles: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResearchQAResult:
    """The unit's summary, and the drift report when the stage checked (for the driver's log)."""

    summary: dict[str, Any]
    report: str | None = None


def run_unit(unit: ResearchQAUnit, report: Report | None) -> ResearchQAResult:
    """Do the configured stage; drift raises :class:`DataError` with the report."""
    from storyforge.tasks.research_qa.check import format_report, run_checks
    from storyforge.tasks.research_qa.export import export_condition, write_modelfile

    settings, out_dir = unit.settings, unit.out_dir
    result: dict[str, Any] = {}
    written: list[str] = []
    text = None
    if settings.stage in ("export", "all"):
        result = export_condition(settings, out_dir)
    if settings.stage in ("modelfiles", "all"):
        path = write_modelfile(settings, unit.modelfiles_dir)
        written.append(str(path))
        result = result or {"task": "research_qa", "stage": "modelfiles"}
        result["modelfile"] = str(path)
    if settings.stage in ("check", "all"):
        artifacts = list(unit.artifacts)
        if settings.stage == "all":
            artifacts.append(out_dir)
        modelfiles = [*unit.modelfiles, *written]
        checked = run_checks(settings.prompt_format, modelfiles=modelfiles, artifacts=artifacts)
        text = format_report(checked)
        if checked.findings:
            raise DataError(text)
        result = result or {"task": "research_qa", "stage": "check"}
        result["check"] = {"checked": list(checked.checked), "findings": 0}
    return ResearchQAResult(summary=result, report=text)


def _done(result: ResearchQAResult) -> dict[str, Any]:
    if result.report is not None:
        log.info("%s", result.report)
    return result.summary


def _absolute_spec(spec: str) -> str:
    """``[MODEL_TYPE=]PATH`` with PATH made absolute against the directory Hydra started in."""
    from storyforge.tasks.research_qa.check import split_modelfile_spec

    model_type, path = split_modelfile_spec(spec)
    absolute = to_absolute_path(path)
    return f"{model_type}={absolute}" if model_type else absolute
