"""Hydra entry point: ``python run.py task=tinystories`` (see README.md).

An error a user can cause (a bad key, a bad record, a model server that refuses) ends the run
with one line on stderr and an exit status that tells them apart (2 config, 3 data, 4 model
server; docs/running.md). ``HYDRA_FULL_ERROR=1`` or ``hydra.verbose=true`` shows the traceback
instead. In a sweep (``-m``) a failed job's line names the job and its overrides, and the
error goes on to Hydra so the sweep records the job; the sweep then ends with the first
failed job's status.

Hydra's own errors (composing the config, making the run directory) are said the same way: run.py
has Hydra raise them (``HYDRA_FULL_ERROR=1``) instead of printing them in several lines, and
says the one line of :func:`storyforge.config.hydra_errors.report`. The ``.hydra`` snapshot is
written by the job once it holds the run lock (storyforge/snapshot.py): run.py tells Hydra not
to write it as the job starts (``++hydra.output_subdir=null``), unless the command line sets
``hydra.output_subdir`` itself.
"""

from __future__ import annotations

import logging
import os
import sys

# numpy (loaded by pyarrow) starts an OpenBLAS thread per core as it loads, some 50 ms of every
# run's start-up (`python -X importtime`), for linear algebra no run does. A value set outside wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from storyforge.config import register_configs
from storyforge.config.hydra_errors import mark_reported, report, was_reported
from storyforge.errors import StoryforgeError, exit_code
from storyforge.redaction import redact, redact_every_log_record
from storyforge.snapshot import HYDRA_SNAPSHOT_OFF

register_configs()
redact_every_log_record()  # Hydra logs a sweep's overrides (a URL's user info) before any job
log = logging.getLogger("storyforge.run")

_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
"""The user asked for tracebacks (read before :func:`_main` sets the variable for Hydra)."""


def _wants_traceback() -> bool:
    return _FULL_ERROR or bool(HydraConfig.get().verbose)


def _log_to_files(exc: BaseException) -> None:
    """The run's log file keeps the whole traceback; the terminal gets one line."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "run failed: %s", (redact(str(exc)),), None)
    record.exc_info = (type(exc), exc, exc.__traceback__)
    record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> object:
    from storyforge.pipeline import run

    try:
        return run(cfg)
    except (StoryforgeError, OSError) as exc:
        if _wants_traceback():
            raise
        _log_to_files(exc)
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode == RunMode.MULTIRUN:  # Hydra records the failed job; the sweep goes on
            job = f"job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)})"
            print(f"error: {redact(job)}: {redact(str(exc))}", file=sys.stderr, flush=True)
            mark_reported(exc)
            raise
        print(f"error: {redact(str(exc))}", file=sys.stderr, flush=True)
        raise SystemExit(exit_code(exc)) from None
    except KeyboardInterrupt as exc:
        if _wants_traceback():
            raise
        print("interrupted: rerun into the same directory to resume", file=sys.stderr, flush=True)
        raise SystemExit(exit_code(exc)) from None


def _main() -> None:
    """:func:`main`, with Hydra's snapshot left to the job and Hydra's errors in one line."""
    if not any(arg.lstrip("+~").startswith("hydra.output_subdir") for arg in sys.argv[1:]):
        sys.argv.append(HYDRA_SNAPSHOT_OFF)  # the job writes the snapshot (storyforge/pipeline.py)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises what it would print
    try:
        main()
    except Exception as exc:
        if _FULL_ERROR:
            raise
        if was_reported(exc):  # a sweep's failed job, said as it failed
            raise SystemExit(exit_code(exc)) from None
        found = report(exc)
        if found is None:  # not a user's error: the traceback
            raise
        line, status = found
        print(redact(line), file=sys.stderr, flush=True)
        raise SystemExit(status) from None


if __name__ == "__main__":
    _main()
