"""The gate inside a run: ``stage=drift``, and the proof a generated Modelfile must pass.

Takes: the ``drift`` group (:class:`~storyforge.config.drift.DriftConf`, as the run's
settings hold it) and the run directory. Gives: :func:`run_gate`
(check the exports, write ``drift_report.json``, one log line per kind, :class:`DataError`
with the report when more examples drift than allowed), :func:`data_context` (the longest
training example in tokens, the ``num_ctx`` that fits it, and a warning when that exceeds
the context the GGUF was trained for) and :func:`modelfile_check` (a Modelfile's text served
by Ollama's rules against the training template on the exports; refused with the divergence
shown when they differ).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from storyforge.config.drift import DriftConf
from storyforge.drift.command import check_exports
from storyforge.drift.examples import read_examples
from storyforge.drift.ollama import OllamaSide
from storyforge.drift.report import DriftReport, needed_num_ctx, run_drift
from storyforge.drift.training import TrainingSide
from storyforge.drift.vocab import read_gguf
from storyforge.errors import DataError
from storyforge.runfiles import DRIFT_REPORT

__all__ = ["REPORT", "data_context", "gate_options", "modelfile_check", "run_gate"]

log = logging.getLogger(__name__)
REPORT = DRIFT_REPORT


def gate_options(settings: DriftConf, *, exports: tuple[Path, ...] = ()) -> DriftConf | None:
    """The run's ``drift`` settings with the run's own ``exports`` checked first; ``None``
    when no tokenizer is set (the gate is off)."""
    if settings.tokenizer is None:
        return None
    return replace(settings, exports=[*(str(p) for p in exports), *settings.exports]).seal()


def _log(report: DriftReport) -> None:
    if not report.ok:
        log.warning("%s", report.format())
        return
    for line in report.log_lines():
        log.info("%s", line)


def _kinds(report: DriftReport) -> str:
    return ", ".join(f"{kind} {count}" for side in report.sides for kind, count in sorted(side.kinds.items()))


def run_gate(options: DriftConf, out_dir: Path) -> dict[str, Any]:
    """Run the gate, write ``drift_report.json`` into ``out_dir``; drift beyond ``allow`` raises."""
    report = check_exports(options, report=str(out_dir / REPORT))
    _log(report)
    if not report.ok:
        raise DataError(
            f"drift: {report.drifted} of {report.examples} example(s) drift (allowed {report.allow}): "
            f"{_kinds(report)}; the first divergences are in the log, all in {out_dir / REPORT}"
        )
    return {"examples": report.examples, "drifted": report.drifted, "report": str(out_dir / REPORT)}


def data_context(options: DriftConf, *, gguf: str | None) -> tuple[int, int, str | None]:
    """``(longest training example in tokens, num_ctx that fits it, warning or None)``."""
    data = read_examples(options.exports)
    if not data.examples:
        raise DataError(f"no examples to size num_ctx from in {', '.join(options.exports)}")
    longest = max(len(r.ids) for r in TrainingSide(options.training_tokenizer).render(data.examples))
    need = needed_num_ctx(longest)
    warning = None
    if gguf and Path(gguf).is_file():
        supported = read_gguf(gguf).context_length
        if supported is not None and need > supported:
            warning = (
                f"num_ctx {need} (for a {longest}-token example) exceeds the {supported} tokens "
                f"{gguf} was trained for"
            )
    return longest, need, warning


def modelfile_check(options: DriftConf, directory: Path, name: str) -> Callable[[str], str]:
    """A check for Modelfile text: served by Ollama's rules it must equal training on every
    example, or :class:`DataError` shows the divergence. Returns a comment for the file."""

    def check(text: str) -> str:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)  # FROM resolves as in place
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            side = OllamaSide(temp, gguf=options.gguf, client_system=options.client_system)
            data = read_examples(options.exports)
            if not data.examples:
                raise DataError(
                    f"{directory / name} refused (not written): nothing to check it against, no examples "
                    f"in {', '.join(options.exports)}"
                )
            report = run_drift(data, TrainingSide(options.training_tokenizer), [side])
        finally:
            Path(temp).unlink(missing_ok=True)
        if not report.ok:
            log.warning("%s", report.format().replace(temp, str(directory / name)))
            raise DataError(
                f"{directory / name} refused (not written): served by Ollama it differs from the training "
                f"chat template on {report.drifted} of {report.examples} example(s): {_kinds(report)}; "
                "the divergence is in the log"
            )
        return (
            f"template: the TEMPLATE below; storyforge drift found it identical to the training chat template "
            f"({Path(options.training_tokenizer).name}/tokenizer_config.json) on {report.examples} exported example(s)"
        )

    return check
