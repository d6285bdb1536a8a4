"""The shape of a job: stages of work units, which any executor runs and the job merges.

Takes: nothing (the protocol). Gives: :class:`Job` (what ``task.job`` names builds: a job
plans its stages and finishes the run), :class:`Stage` (one step of a job: its work units,
the function that does one unit, and the merge of their results) and :class:`Progress`
(what a stage's progress bar shows).

How a run goes (:func:`storyforge.executors.execute`)::

    for stage in job.stages(executor.shards, executor.describe()):  # plan the next step's units
        results = executor.map(stage)       # do every unit, anywhere; results in unit order
        stage.merge(results)                # merge on the driver
    return job.finish()                     # the run's manifest / summary

Why: ``executor=local`` runs every unit in this process, ``executor=ray`` runs them as Ray
tasks; both drive the same job code, and an executor knows nothing about any task. A later
stage is planned only after the earlier one merged (the TinyStories job plans its generation
units from the merged seed files), so :meth:`Job.stages` is a generator.

Rules a job keeps so every executor gives the same bytes: a unit and its ``run`` function are
picklable (module-level functions, frozen settings, absolute paths: a worker shares neither
the driver's working directory nor its Hydra state); ``run`` writes only below the unit's own
directory and returns plain data; ``merge`` depends only on the results' order, never on
completion order; whatever reaches the terminal (printing, the run's log) happens on the
driver, in ``merge`` or ``finish``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Job", "OneUnitJob", "Progress", "Report", "Stage"]

U = TypeVar("U")
R = TypeVar("R")

Report = Callable[[int, int], None]
"""``report(done, errors)``: how far one unit got (for a progress bar); may be called often."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """A stage whose units report progress: the bar's total (over all units) and its label."""

    total: int
    desc: str
    enabled: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage(Generic[U, R]):
    """One step of a job: ``run(unit, report)`` for every unit, then ``merge(results)``."""

    name: str
    """Names the stage in the executor's timings (``<name>_s``)."""
    units: Sequence[U]
    run: Callable[[U, Report | None], R]
    """Does one unit, in any process; a module-level function (picklable)."""
    merge: Callable[[list[R]], None]
    """On the driver: the results, in the order of ``units``."""
    progress: Progress | None = None
    """Set when ``run`` reports progress through its ``report`` argument."""


class Job(Protocol):
    """What ``task.job`` builds from the run's settings; an executor drives it."""

    def stages(self, shards: int, executor: Mapping[str, Any] | None) -> Iterator[Stage[Any, Any]]:
        """The job's stages in order. ``shards``: how many units a stage may be split into (1
        under ``executor=local``); ``executor``: how the run is spread, for the manifest
        (``None`` in one process; its ``timings`` fill in as the run goes)."""
        ...

    def finish(self) -> dict[str, Any]:
        """After the last merge: write what is left and return the run's summary."""
        ...


@dataclass(slots=True, kw_only=True)
class OneUnitJob(Generic[U, R]):
    """A job that is one unit of work: ``run(unit)`` anywhere, then ``done(result)`` on the driver.

    ``done`` is where the driver logs or prints what the unit found, and its return value is
    the job's summary. Any executor runs the unit; there is nothing to split or merge.
    """

    name: str
    unit: U
    run: Callable[[U, Report | None], R]
    done: Callable[[R], dict[str, Any]]
    _result: list[R] = field(default_factory=list)

    def stages(self, shards: int, executor: Mapping[str, Any] | None) -> Iterator[Stage[U, R]]:
        """The one stage (whatever ``shards`` is)."""
        yield Stage(name=self.name, units=[self.unit], run=self.run, merge=self._result.extend)

    def finish(self) -> dict[str, Any]:
        """``done`` of the unit's result."""
        return self.done(self._result[0])
