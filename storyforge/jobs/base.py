"""The shape of a job: stages of work units, which any executor runs and the job merges.

Takes: nothing (the protocol). Gives: :class:`Job` (what ``task.job`` names builds: a job
plans its stages and finishes the run), :class:`Stage` (one step of a job: its work units,
the function that does one unit, and the merge of their results) and :class:`Progress`
(what a stage's progress bar shows).

How a run goes (:func:`storyforge.executors.execute`)::

    for stage in job.stages(executor.shards):      # plan: the units of the next step
        results = executor.map(stage)             # do every unit, anywhere (in order of units)
        stage.merge(results)                      # merge on the driver, in unit order
    return job.finish(executor.describe())        # the run's manifest / summary

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
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Job", "Progress", "Report", "Stage"]

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

    def stages(self, shards: int) -> Iterator[Stage[Any, Any]]:
        """The job's stages in order; ``shards`` is how many units the executor would like."""
        ...

    def finish(self, executor: Mapping[str, Any] | None) -> dict[str, Any]:
        """After the last merge: write what is left and return the run's summary.

        ``executor`` describes how the run was spread (``None`` for one process); a job that
        records it puts it in its manifest."""
        ...


def in_order(units: Sequence[Any], results: Mapping[int, R]) -> list[R]:
    """The results by unit index, as :attr:`Stage.merge` receives them."""
    return [results[k] for k in range(len(units))]
