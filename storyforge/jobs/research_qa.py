"""The research-QA job: config -> one condition's exports, its Modelfile, or a drift check.

Takes: the run's settings (``task=research_qa``, see :mod:`storyforge.config.settings`) and
the Hydra run directory. Gives, by
``stage``:

- ``export`` (default): ``train.jsonl``, ``eval.jsonl``, ``rejected.jsonl`` and
  ``manifest.json`` of the condition (``model`` x ``task.prompt_mode``) in the run directory;
- ``modelfiles``: ``Modelfile.<model_type>`` in ``task.modelfiles_dir`` (or the run directory);
- ``check``: every validator over the prompt format itself, ``task.check.artifacts`` and
  ``task.check.modelfiles``; drift raises :class:`~storyforge.errors.DataError` (exit 1);
- ``drift``: export, then the train/serve gate (:mod:`storyforge.drift`) on the export and
  ``drift.exports`` with the serving sides of the ``drift`` group; ``drift_report.json``;
- ``all``: export, Modelfile and check of the run directory, in that order (and the gate when
  ``drift.tokenizer`` is set).

With ``drift.tokenizer`` set, a Modelfile is written only after the gate shows that Ollama,
serving it, gives the exported conversations exactly the training tokens; its ``num_ctx`` is
the power of two that fits the longest exported example.

Returns the manifest (export) or a summary mapping. Why a thin module: the work lives in
:mod:`storyforge.tasks.research_qa` so the library, the CLI and this job share it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path

from storyforge.config.drift import DriftConf, check_drift_stage
from storyforge.config.research_qa import ResearchQASettings
from storyforge.config.settings import RunSettings
from storyforge.errors import ConfigError, DataError
from storyforge.jobs.base import OneUnitJob, Report

__all__ = ["ResearchQAResult", "ResearchQAUnit", "run", "run_unit"]

log = logging.getLogger(__name__)


def run(run_settings: RunSettings, out_dir: Path) -> OneUnitJob[ResearchQAUnit, ResearchQAResult]:
    """The research-QA job: its one unit does the configured stage in ``out_dir``.

    Checked here, on the driver: the drift gate's options (``stage=drift`` needs a tokenizer),
    and every path the config names relative to where the run started, made absolute so the
    unit does the same wherever it runs."""
    from storyforge.drift.stage import gate_options

    settings = run_settings.task
    assert isinstance(settings, ResearchQASettings)
    stage = settings.stage
    exported = (out_dir,) if stage in ("export", "all", "drift") else ()
    check_drift_stage(run_settings.drift, stage)
    drift = gate_options(run_settings.drift, exports=exported)
    target = settings.task.modelfiles_dir
    unit = ResearchQAUnit(
        settings=settings,
        out_dir=Path(out_dir),
        modelfiles_dir=Path(to_absolute_path(target)) if target else Path(out_dir),
        artifacts=tuple(Path(to_absolute_path(p)) for p in settings.task.check.artifacts),
        modelfiles=tuple(_absolute_spec(s) for s in settings.task.check.modelfiles),
        drift=drift,
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
    drift: DriftConf | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResearchQAResult:
    """The unit's summary, and the drift report when the stage checked (for the driver's log)."""

    summary: dict[str, Any]
    report: str | None = None


def run_unit(unit: ResearchQAUnit, report: Report | None) -> ResearchQAResult:
    """Do the configured stage; drift raises :class:`DataError` with the report."""
    from storyforge.tasks.research_qa.check import format_report, run_checks
    from storyforge.tasks.research_qa.export import export_condition, write_modelfile

    settings, out_dir, drift = unit.settings, unit.out_dir, unit.drift
    stage = settings.stage
    result: dict[str, Any] = {}
    written: list[str] = []
    text = None
    if stage in ("export", "all", "drift"):
        result = export_condition(settings, out_dir)
    if stage in ("modelfiles", "all"):
        directory = unit.modelfiles_dir
        proof = _modelfile_proof(settings, drift, directory) if drift is not None else {}
        path = write_modelfile(settings, directory, **proof)
        written.append(str(path))
        result = result or {"task": "research_qa", "stage": "modelfiles"}
        result["modelfile"] = str(path)
    if stage in ("check", "all"):
        artifacts = list(unit.artifacts)
        if stage == "all":
            artifacts.append(out_dir)
        modelfiles = [*unit.modelfiles, *written]
        checked = run_checks(settings.prompt_format, modelfiles=modelfiles, artifacts=artifacts)
        text = format_report(checked)
        if checked.findings:
            raise DataError(text)
        result = result or {"task": "research_qa", "stage": "check"}
        result["check"] = {"checked": list(checked.checked), "findings": 0}
    if drift is not None and stage in ("drift", "all"):
        from storyforge.drift.stage import run_gate

        result["drift"] = run_gate(drift, out_dir)
    return ResearchQAResult(summary=result, report=text)


def _done(result: ResearchQAResult) -> dict[str, Any]:
    if result.report is not None:
        log.info("%s", result.report)
    return result.summary


def _modelfile_proof(settings: ResearchQASettings, drift: DriftConf, directory: Path) -> dict[str, Any]:
    """``num_ctx`` sized to the exports and a check that the Modelfile serves what training saw."""
    from storyforge.drift.stage import data_context, modelfile_check
    from storyforge.tasks.research_qa.export import modelfile_name

    if not drift.exports:
        raise ConfigError(
            "a Modelfile is proven against exports: with drift.tokenizer set, stage=modelfiles needs "
            "drift.exports=[...] (or use stage=all, which exports first)"
        )
    from_ = Path(settings.model.gguf_path)
    gguf = drift.gguf or str(from_ if from_.is_absolute() else directory / from_)
    longest, need, warning = data_context(drift, gguf=gguf)
    if warning:
        log.warning("%s", warning)
    note = f"num_ctx {need}: the longest exported example is {longest} tokens (a power of two that fits it)"
    return {
        "num_ctx": need,
        "notes": (note,),
        "check": modelfile_check(drift, directory, modelfile_name(settings.model_type)),
    }


def _absolute_spec(spec: str) -> str:
    """``[MODEL_TYPE=]PATH`` with PATH made absolute against the directory Hydra started in."""
    from storyforge.tasks.research_qa.check import split_modelfile_spec

    model_type, path = split_modelfile_spec(spec)
    absolute = to_absolute_path(path)
    return f"{model_type}={absolute}" if model_type else absolute
