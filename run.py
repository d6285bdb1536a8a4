"""Hydra entry point: ``python run.py task=tinystories`` (see README.md).

An error a user can cause (a bad key, a bad record, a model server that refuses) ends the run
with one line on stderr and an exit status that tells them apart (2 config, 3 data, 4 model
server; docs/running.md). ``HYDRA_FULL_ERROR=1`` or ``hydra.verbose=true`` shows the traceback
instead. In a sweep (``-m``) a failed job's line names the job and its overrides, and the
error goes on to Hydra so the sweep records the job; the sweep then ends with the first
failed job's status.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from storyforge.config import register_configs
from storyforge.config.hydra_compose import install as compose_the_config_once
from storyforge.config.hydra_errors import install as report_hydra_errors_in_one_line
from storyforge.config.hydra_errors import mark_reported
from storyforge.config.hydra_snapshot import install as write_the_snapshot_under_the_lock
from storyforge.errors import StoryforgeError, exit_code
from storyforge.redaction import redact, redact_every_log_record

register_configs()
redact_every_log_record()  # Hydra logs a sweep's overrides (a URL's user info) before any job
report_hydra_errors_in_one_line()
compose_the_config_once()  # Hydra would compose it twice: once to read hydra.mode
write_the_snapshot_under_the_lock()  # Hydra would write it before the job holds the lock
log = logging.getLogger("storyforge.run")


def _wants_traceback() -> bool:
    hydra_cfg = HydraConfig.get()
    return os.environ.get("HYDRA_FULL_ERROR") == "1" or bool(hydra_cfg.verbose)


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


if __name__ == "__main__":
    main()
