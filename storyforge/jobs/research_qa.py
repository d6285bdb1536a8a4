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
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path

from storyforge.config.research_qa import ResearchQASettings
from storyforge.config.settings import RunSettings
from storyforge.errors import DataError

__all__ = ["run"]

log = logging.getLogger(__name__)


def run(run_settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    """Run the configured stage of ``task=research_qa`` in ``out_dir``."""
    from storyforge.tasks.research_qa.check import format_report, run_checks
    from storyforge.tasks.research_qa.export import export_condition, write_modelfile

    settings = run_settings.task
    assert isinstance(settings, ResearchQASettings)
    result: dict[str, Any] = {}
    written: list[str] = []
    if settings.stage in ("export", "all"):
        result = export_condition(settings, out_dir)
    if settings.stage in ("modelfiles", "all"):
        target = settings.task.modelfiles_dir
        path = write_modelfile(settings, Path(to_absolute_path(target)) if target else out_dir)
        written.append(str(path))
        result = result or {"task": "research_qa", "stage": "modelfiles"}
        result["modelfile"] = str(path)
    if settings.stage in ("check", "all"):
        artifacts = [Path(to_absolute_path(p)) for p in settings.task.check.artifacts]
        if settings.stage == "all":
            artifacts.append(out_dir)
        modelfiles = [*(_absolute_spec(s) for s in settings.task.check.modelfiles), *written]
        report = run_checks(settings.prompt_format, modelfiles=modelfiles, artifacts=artifacts)
        text = format_report(report)
        if report.findings:
            raise DataError(text)
        log.info("%s", text)
        result = result or {"task": "research_qa", "stage": "check"}
        result["check"] = {"checked": list(report.checked), "findings": 0}
    return result


def _absolute_spec(spec: str) -> str:
    """``[MODEL_TYPE=]PATH`` with PATH made absolute against the directory Hydra started in."""
    from storyforge.tasks.research_qa.check import split_modelfile_spec

    model_type, path = split_modelfile_spec(spec)
    absolute = to_absolute_path(path)
    return f"{model_type}={absolute}" if model_type else absolute
