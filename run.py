"""Hydra entry point: ``python run.py task=tinystories`` (see README.md).

An error a user can cause (a bad key, a bad record, a model server that refuses) ends the run
with one line on stderr and an exit status that tells them apart (2 config, 3 data, 4 model
server; docs/running.md). ``HYDRA_FULL_ERROR=1`` or ``hydra.verbose=true`` shows the traceback
instead. In a sweep (``-m``) a failed job's line names the job and its overrides, and the
error goes on to Hydra so the sweep records the job; the sweep then ends with the first
failed job's status.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys

# Start-up (the libraries, Hydra's composition) makes some half a million objects that live as
# long as the run; the cyclic collector would walk them over and over as they are made (about
# 50 ms of a run's start-up) and again in each full collection of the job. So it stays off
# until the job starts, and what start-up made is then put out of its reach (see main).
# Only as a script: a program that imports this module keeps its collector as it is.
if __name__ == "__main__":
    gc.disable()

# Arrow's buffers (the Parquet twins' rows and pages, written on a worker thread) come from
# jemalloc, which reuses a written row group's memory for the next one and gives back what
# stays unused for 0.1 s (storyforge/tables.py): the C library's allocator mapped each group's
# buffers afresh, about 2 us of kernel time per seed in page faults, and mimalloc kept some
# 40 MiB more at the peak. Read by Arrow when it is first loaded; a value set outside wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
# Arrow loads numpy, and numpy's OpenBLAS starts a thread per core as it loads (some 40 ms of
# a run's start-up) for linear algebra no run does: one thread. A value set outside wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _unmap_large_blocks() -> None:
    """glibc: every block of 256 KiB or more gets its own mapping, unmapped when freed.

    By default glibc raises that threshold to the size of the largest block freed so far, so
    the row groups' buffers (a few MiB each) end up in the heap, where freed memory stays with
    the process: about 30 MiB more at the peak of a 100,000-seed job. The price is page
    faults, as each row group's buffers are mapped afresh: about a third more CPU time on the
    twins' worker thread, which runs beside the job's own. Elsewhere than glibc: nothing.
    """
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD, in the C library's symbols
    except (OSError, AttributeError):  # not glibc
        pass


_unmap_large_blocks()

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
# At exit, everything still alive is moved out of the cyclic collector's reach, which spares
# the interpreter a full collection of the loaded libraries (about 0.1 s per run). Nothing
# is lost: outputs are committed by then, and logging's own exit handler still flushes.
atexit.register(gc.freeze)


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


def _collect_from_here() -> None:
    """The first job starts: the cyclic collector is turned on, for what is made from now on.

    Whatever start-up made is moved to the collector's permanent generation (``gc.freeze``):
    still freed when no longer referenced, but never walked again. The price is that cyclic
    garbage made during start-up (about 2 MiB) is not freed. The jobs after the first one of a
    sweep (``-m``) run with the collector as it is.
    """
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> object:
    from storyforge.pipeline import run

    _collect_from_here()
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
