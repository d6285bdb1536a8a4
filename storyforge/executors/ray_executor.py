"""The Ray executor: a job's units as Ray tasks, on this machine or a cluster.

Takes: the executor settings (``executor=ray``) and a :class:`~storyforge.jobs.base.Job`'s
stages. Gives: :class:`RayExecutor`, which runs every unit of a stage as a Ray task (started
again up to ``executor.max_retries`` times when its worker process dies), hands the results
back in unit order, and draws one progress bar for a stage whose units report (through a small
:class:`~storyforge.progress.UnitCounts` actor); :func:`start_local_ray`; and the manifest's ``executor`` entry:
name, address, shards and the driver's seconds per stage (``<stage>_s``, plus ``merge_s`` for
planning and merging), which add up to the run's time.

Knows nothing about any task: the job says what a unit is, how to do one and how to merge
them (see :mod:`storyforge.jobs.base`), and the same job code runs under ``executor=local``.
A unit's :class:`~storyforge.errors.StoryforgeError` comes back as itself (one clear line).

Where: ``executor.address=local`` starts a private Ray instance (``executor.num_cpus``) and
stops it at the end; ``auto`` and ``ray://...`` join a running cluster. Every node must see
the run directory at the same path (a shared filesystem), as units write there.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import storyforge
from storyforge.config.executor import ExecutorConf
from storyforge.errors import StoryforgeError
from storyforge.executors.local import stage_bar
from storyforge.extras import require
from storyforge.jobs.base import Stage
from storyforge.progress import UnitCounts

__all__ = ["RayExecutor", "start_local_ray"]

log = logging.getLogger(__name__)

_POLL_S = 0.5
_START_ATTEMPTS = 3
"""Ray gives its raylet a fixed 30 s to register; on a machine busy with other work it can
miss that, and a fresh attempt usually succeeds."""


def _ray() -> Any:
    return require("ray", extra="ray", for_what="executor=ray (or choose executor=local)")


def start_local_ray(num_cpus: int | None) -> None:
    """Start a private Ray instance whose workers import this same storyforge."""
    ray = _ray()
    root = str(Path(storyforge.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": path}},
            )
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == _START_ATTEMPTS:
                raise
            log.warning("the local Ray instance did not start in time (%s); starting it again", exc)
            ray.shutdown()


@dataclass(frozen=True, slots=True)
class _Reporter:
    """The ``report`` callback a unit gets: forwards its counts to the :class:`UnitCounts` actor."""

    actor: Any
    unit: int

    def __call__(self, done: int, errors: int) -> Any:
        return self.actor.report.remote(self.unit, done, errors)


@dataclass(slots=True)
class _Flushed:
    """A unit's reporter that remembers its last call, so the unit can wait until the actor has
    taken it: the driver then reads the final counts as soon as the unit's result is ready."""

    report: _Reporter
    last: Any = None

    def __call__(self, done: int, errors: int) -> None:
        self.last = self.report(done, errors)


class RayExecutor:
    """Runs a job's units as Ray tasks (``executor=ray``); use it as a context manager."""

    def __init__(self, conf: ExecutorConf) -> None:
        self.conf = conf
        self.shards = conf.shards
        self._started_here = False
        self._quiet = ExitStack()
        self._timings: dict[str, float] = {}
        self._description: dict[str, Any] = {
            "name": "ray",
            "address": conf.address,
            "shards": conf.shards,
            "timings": self._timings,
        }

    def __enter__(self) -> Self:
        ray = _ray()
        self._quiet.enter_context(ray_messages_to_log_file())
        if not ray.is_initialized():
            if self.conf.address == "local":
                start_local_ray(self.conf.num_cpus)
            else:
                ray.init(address=self.conf.address, configure_logging=False, log_to_driver=False)
            self._started_here = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._started_here:
                _ray().shutdown()
        finally:
            self._quiet.close()

    def describe(self) -> dict[str, Any]:
        """The manifest's ``executor`` entry; its ``timings`` fill in as the run goes."""
        return self._description

    def map(self, stage: Stage[Any, Any]) -> list[Any]:
        """Every unit of ``stage`` as a Ray task; the results in unit order."""
        ray = _ray()
        started = time.perf_counter()
        task = ray.remote(_run_unit).options(max_retries=self.conf.max_retries)
        try:
            if stage.progress is None:
                return list(_get(ray, [task.remote(stage.run, unit, None) for unit in stage.units]))
            return self._with_bar(ray, task, stage)
        finally:
            key = f"{stage.name}_s"
            self._timings[key] = round(self._timings.get(key, 0.0) + time.perf_counter() - started, 3)

    def _with_bar(self, ray: Any, task: Any, stage: Stage[Any, Any]) -> list[Any]:
        assert stage.progress is not None
        progress = ray.remote(num_cpus=0)(UnitCounts).remote()
        refs = {task.remote(stage.run, unit, _Reporter(progress, k)): k for k, unit in enumerate(stage.units)}
        results: dict[int, Any] = {}
        bar = stage_bar(stage.progress)
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
                for ref in ready:
                    results[refs[ref]] = _get(ray, ref)
                done, errors = ray.get(progress.totals.remote())
                bar.update(max(0, done - bar.n))
                bar.set_postfix(errors=errors, refresh=not pending)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            bar.close()
            ray.kill(progress)
        return [results[k] for k in range(len(stage.units))]


def _run_unit(run: Any, unit: Any, report: Any) -> Any:
    """What a Ray task does: one unit (a module-level function, so the task pickles by name)."""
    if report is None:
        return run(unit, None)
    flushed = _Flushed(report)
    result = run(unit, flushed)
    if flushed.last is not None:  # calls from one caller reach the actor in order
        _ray().get(flushed.last)
    return result


def _get(ray: Any, refs: Any) -> Any:
    """``ray.get`` that re-raises a unit's storyforge error as itself (one clear line)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, StoryforgeError):
            raise cause from None
        raise


@contextmanager
def ray_messages_to_log_file() -> Iterator[None]:
    """Ray's own log messages (its start-up banner, the token-authentication notice, ...) go to
    the run's log file only, not to the terminal, unless asked for with ``hydra.verbose=ray``
    (or ``hydra.verbose=true``), which sets Ray's logger to DEBUG."""
    if logging.getLogger("ray").isEnabledFor(logging.DEBUG):
        yield
        return
    # ray.init(configure_logging=False) clears the "ray" logger's handlers and leaves it not
    # propagating, so its messages reach logging's last-resort handler, which prints them on
    # stderr: for this run, that handler writes to the run's log files instead.
    saved = logging.lastResort
    logging.lastResort = _ToLogFiles(logging.WARNING)
    try:
        yield
    finally:
        logging.lastResort = saved


class _ToLogFiles(logging.Handler):
    """Hands a record to the root logger's file handlers (the run's ``run.log``) only."""

    def emit(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)
