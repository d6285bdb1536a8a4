"""The TinyStories job's generation in one process: priced, regenerated until valid, judged.

Takes: the run's settings and the run directory (its ``prompts_seed.jsonl`` and
``prompts.jsonl`` written). Gives: :class:`ChainsUnit` with :func:`run_chains`, the unit of
the job's ``generate`` stage under ``executor=local``: it opens the cost meter (the estimate
logged, and checked against ``provider.max_cost_usd``, before the first request), generates
``generations.jsonl`` (every answer priced; with ``stage=judge`` every answer must be
journaled already), sorts it, and, with ``regenerate.max_attempts > 1`` or a judge, runs
the judge and attempts 2..K into ``attempts.jsonl`` (:mod:`storyforge.jobs.regenerate`).
:class:`Chains` is what it found: the completion file the checks read, the figures, and the
meter the report's cost section is read from.

Why local only: the meter is one object every request of the run updates, and the chains
read the whole journal; ``executor=ray`` refuses these settings before anything is written
(see :func:`storyforge.jobs.tinystories.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge.config.settings import RunSettings
from storyforge.jobs.base import Report
from storyforge.jobs.order import sort_generations
from storyforge.providers.cost import CostEstimate, CostMeter

__all__ = ["Chains", "ChainsUnit", "cost_section", "run_chains"]

SEEDS = "prompts_seed.jsonl"
PROMPTS = "prompts.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainsUnit:
    """Generate (and regenerate, and judge) the prompts of the run directory ``dir``."""

    settings: RunSettings
    dir: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Chains:
    """What :func:`run_chains` did."""

    completions: Path
    """``generations.jsonl``, or ``attempts.jsonl`` when chains were run."""
    generation: dict[str, Any]
    regeneration: dict[str, Any] | None
    meter: CostMeter
    estimate: CostEstimate


def run_chains(unit: ChainsUnit, report: Report | None) -> Chains:
    """Do one :class:`ChainsUnit` (in the driver's process)."""
    from storyforge.jobs.costing import open_meter
    from storyforge.providers.runner import generate_for_job

    run, out = unit.settings, unit.dir
    provider = run.provider
    assert provider is not None, "the generate stage runs with a provider"
    regen, judge = run.regenerate, run.judge
    # Cost (storyforge.config.pricing): the estimate is logged and checked before any request.
    meter, estimate = open_meter(
        provider, run.pricing, out / PROMPTS, attempts=regen.max_attempts, judged=judge.enabled
    )
    # stage=judge: the generation answers must all be in the journals already.
    require_done = "stage=judge" if run.stage == "judge" else None
    path, stats = generate_for_job(run.generation, out, out / PROMPTS, meter=meter, require_done=require_done)
    sort_generations(path, out / PROMPTS)  # the order every executor writes
    regeneration = None
    if regen.enabled or judge.enabled:  # judge, then attempts 2..K (storyforge.jobs.regenerate)
        from storyforge.jobs.regenerate import regenerate

        path, regeneration = regenerate(
            run.generation,
            out,
            out / SEEDS,
            out / PROMPTS,
            path,
            regen,
            max_chars=run.export.max_chars,
            meter=meter,
            judge=judge,
            require_done=require_done,
        )
    return Chains(
        completions=path, generation=stats, regeneration=regeneration, meter=meter, estimate=estimate
    )


def cost_section(meter: CostMeter) -> Callable[[int], dict[str, Any]]:
    """The report's cost section for a given number of passing samples."""

    def section(passed: int) -> dict[str, Any]:
        return meter.summary(passed=passed)

    return section
