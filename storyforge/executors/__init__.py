"""Executors: how a job's work units are spread over processes and machines.

Takes: a :class:`~storyforge.jobs.base.Job` and the executor settings. Gives: :func:`execute`,
which drives the job's stages on the executor ``executor.name`` selects (``local``: every unit
in this process, :class:`~storyforge.executors.local.LocalExecutor`; ``ray``: units as Ray
tasks, :class:`~storyforge.executors.ray_executor.RayExecutor`, needs the ``ray`` extra) and
returns what the job's ``finish`` returns; and, for convenience, :func:`shard_of` and
:func:`sort_generations` (the record order every executor writes, :mod:`storyforge.jobs.order`).

An executor knows nothing about any task, and both drive the same job code: the files of an
``executor=ray`` run equal an ``executor=local`` run's, byte for byte.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from storyforge.config.executor import ExecutorConf
from storyforge.jobs.base import Job, Stage
from storyforge.jobs.order import shard_of, sort_generations

__all__ = ["Executor", "drive", "execute", "shard_of", "sort_generations"]


class Executor(Protocol):
    """Runs the units of a stage somewhere and returns their results in unit order."""

    shards: int

    def describe(self) -> dict[str, Any] | None: ...

    def map(self, stage: Stage[Any, Any]) -> list[Any]: ...


def drive(job: Job, executor: Executor) -> dict[str, Any]:
    """Plan each stage, run its units on ``executor``, merge them; then finish the job.

    The seconds spent planning and merging on the driver add up in ``timings.merge_s`` of the
    executor's description, when it keeps one."""
    description = executor.describe()
    timings = description.get("timings") if description is not None else None
    stages = job.stages(executor.shards, description)
    while True:
        started = time.perf_counter()
        stage = next(stages, None)
        _lap(timings, "merge", started)
        if stage is None:
            break
        results = executor.map(stage)
        started = time.perf_counter()
        stage.merge(results)
        _lap(timings, "merge", started)
    return job.finish()


def _lap(timings: dict[str, float] | None, name: str, started: float) -> None:
    if timings is not None:
        key = f"{name}_s"
        timings[key] = round(timings.get(key, 0.0) + time.perf_counter() - started, 3)


def execute(job: Job, conf: ExecutorConf) -> dict[str, Any]:
    """Run ``job`` on the executor ``conf`` names."""
    if conf.name == "local":
        from storyforge.executors.local import LocalExecutor

        return drive(job, LocalExecutor())
    from storyforge.executors.ray_executor import RayExecutor

    with RayExecutor(conf) as executor:
        return drive(job, executor)
