"""The local executor: every unit of every stage, in this process, one after another.

Takes: a :class:`~storyforge.jobs.base.Job`'s stages. Gives: :class:`LocalExecutor`
(``executor=local``, the default). It asks a job for one unit per stage (``shards = 1``), so
the job writes its files straight into the run directory, and it leaves no executor entry in
the manifest. A stage whose units report progress gets a tqdm bar here.
"""

from __future__ import annotations

from typing import Any

from storyforge.jobs.base import Progress, Stage
from storyforge.progress import UnitCounts, progress_bar

__all__ = ["LocalExecutor", "stage_bar"]


def stage_bar(progress: Progress) -> Any:
    """The bar of a stage whose units report (done / total, rate, errors), on stderr."""
    return progress_bar(
        total=progress.total,
        desc=progress.desc,
        unit="req",
        show=progress.enabled,
        dynamic_ncols=True,
        postfix={"errors": 0},
    )


class LocalExecutor:
    """Runs a job's units in this process (``executor=local``)."""

    shards = 1

    def describe(self) -> dict[str, Any] | None:
        """Nothing: a run in one process leaves no executor entry in its manifest."""
        return None

    def map(self, stage: Stage[Any, Any]) -> list[Any]:
        """``stage.run`` for each unit in turn; the results in unit order."""
        if stage.progress is None:
            return [stage.run(unit, None) for unit in stage.units]
        bar = stage_bar(stage.progress)
        counts = UnitCounts()

        def reporter(k: int) -> Any:
            def report(done: int, errors: int) -> None:
                counts.report(k, done, errors)
                total, failed = counts.totals()
                bar.update(max(0, total - bar.n))
                bar.set_postfix(errors=failed, refresh=False)

            return report

        try:
            return [stage.run(unit, reporter(k)) for k, unit in enumerate(stage.units)]
        finally:
            bar.close()
