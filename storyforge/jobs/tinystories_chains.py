"""The TinyStories job's generation: priced, regenerated until valid, judged; in one process or per shard.

Takes: the run's settings and the run directory (its ``prompts_seed.jsonl`` and
``prompts.jsonl`` written), or a shard directory of it. Gives:

* :class:`GenerateUnit` with :func:`run_generate`, the unit of the job's ``generate`` stage,
  one per shard (``executor=local`` has one, ``whole``: the run directory itself). It
  generates the shard's ``generations.jsonl`` (every answer priced on the unit's meter; with
  ``stage=judge`` every answer must be journaled already), sorts it, and, with
  ``regenerate.max_attempts > 1`` or a judge, runs the judge and attempts 2..K into
  ``attempts.jsonl`` (:mod:`storyforge.jobs.regenerate`; without a judge each chain's next
  attempt is sent as soon as the one before is checked). A shard of several works in its own
  directory (its own journals, attempt and judge files, under the shard's lock).
* :func:`open_run_meter` (on the driver, before the stage: the estimate logged, and checked
  against ``provider.max_cost_usd``, before the first request), :func:`shard_meters` (each
  unit's meter) and :func:`merge_shard_chains`, which merges the shards' files on the driver
  into the run directory by (seed position, sample, attempt), so they are the files one shard
  writes, byte for byte. :class:`Generated` is what a shard, or the stage, did: the completion
  file the checks read, the figures, and the meter the report's cost section is read from.

Cost: the driver opens the meter (the estimate and the refusal); one shard spends on it.
With several shards (``executor=ray``) each gets a fresh meter whose limit is its share of ``provider.max_cost_usd``
(the limit times its prompts over all prompts) and stops on its own when its spending
reaches that share: within one in-flight window (``provider.concurrency``) of that shard. A
shard that stops returns what it spent instead of failing, the other shards go on to their
own end, and then the driver stops the run with :class:`~storyforge.errors.BudgetExceeded`
(exit status 5). A rerun with a higher limit gives every shard a higher share; the answers in
the shards' journals count as spent and are never sent again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge.config.provider import GenerationSettings
from storyforge.config.settings import RunSettings
from storyforge.errors import BudgetExceeded
from storyforge.jobs.base import Report
from storyforge.jobs.order import sort_generations
from storyforge.jobs.tinystories_shards import (
    combine_stats,
    generating,
    merge_generations,
    quiet_generation,
)
from storyforge.providers.cost import CostEstimate, CostMeter
from storyforge.providers.error_budget import ErrorBudget
from storyforge.runfiles import GENERATIONS, PROMPTS, SEEDS

__all__ = [
    "GenerateUnit",
    "Generated",
    "chains_enabled",
    "cost_section",
    "merge_shard_chains",
    "open_run_meter",
    "run_generate",
    "shard_meters",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateUnit:
    """Generate (and regenerate, and judge) the prompts of the shard directory ``dir``."""

    settings: RunSettings
    dir: Path
    meter: CostMeter
    """The run's meter (one shard), or a fresh one whose limit is this shard's share of
    ``provider.max_cost_usd``."""
    whole: bool
    """The only shard, the run directory itself: no lock, the runner's own progress bar, the
    error-rate limit checked as it goes and the cost limit raised at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Generated:
    """What :func:`run_generate` did in one shard, or the ``generate`` stage in the run (its
    shards merged)."""

    generation: dict[str, Any] | None
    """The generation figures (None when the shard stopped at its share of the limit)."""
    regeneration: dict[str, Any] | None
    meter: CostMeter
    completions: Path | None = None
    """``generations.jsonl``, or ``attempts.jsonl`` when chains were run."""
    stopped: str | None = None
    """Why the shard stopped early: its spending reached its share of the limit."""


def chains_enabled(run: RunSettings) -> bool:
    """Whether the run regenerates or judges (and so checks ``attempts.jsonl``)."""
    return run.regenerate.enabled or run.judge.enabled


def run_generate(unit: GenerateUnit, report: Report | None) -> Generated:
    """Do one :class:`GenerateUnit` (on any worker)."""
    run, out, meter = unit.settings, unit.dir, unit.meter
    if unit.whole:
        path, stats, regeneration = _generate(run, run.generation, out, meter)
        return Generated(generation=stats, regeneration=regeneration, meter=meter, completions=path)
    try:
        with generating(out, report):
            path, stats, regeneration = _generate(
                run, quiet_generation(run.generation), out, meter, early_stop=False
            )
    except BudgetExceeded as exc:
        return Generated(generation=None, regeneration=None, meter=meter, stopped=str(exc))
    if report is not None:
        report(int(stats["total"]), int(stats["errors"]))
    return Generated(generation=stats, regeneration=regeneration, meter=meter, completions=path)


def open_run_meter(run: RunSettings, out: Path) -> tuple[CostMeter, CostEstimate]:
    """The run's meter; its estimate is logged, and checked against the limit, before any request."""
    from storyforge.jobs.costing import open_meter

    provider = run.provider
    assert provider is not None, "the generate stage runs with a provider"
    return open_meter(
        provider, run.pricing, out / PROMPTS, attempts=run.regenerate.max_attempts, judged=run.judge.enabled
    )


def _generate(
    run: RunSettings, generation: GenerationSettings, out: Path, meter: CostMeter, *, early_stop: bool = True
) -> tuple[Path, dict[str, Any], dict[str, Any] | None]:
    """Generate ``out``'s prompts, sort the journal, then the judge and attempts 2..K.

    Failed requests and judge errors count toward ``provider.max_error_rate`` over the whole
    run (:mod:`storyforge.providers.error_budget`); with ``early_stop`` the run stops as soon as
    the limit is certain to be passed (a shard leaves that to the driver, which sees the run)."""
    from storyforge.providers.runner import generate_for_job

    budget = ErrorBudget(
        max_error_rate=generation.provider.max_error_rate if early_stop else 1.0,
        attempts=run.regenerate.max_attempts,
        judged=run.judge.enabled,
    )
    # stage=judge: the generation answers must all be in the journals already.
    require_done = "stage=judge" if run.stage == "judge" else None
    if _pipelined(run, generation):
        from storyforge.jobs.regenerate import regenerate_pipelined

        return regenerate_pipelined(
            generation,
            out,
            out / SEEDS,
            out / PROMPTS,
            run.regenerate,
            max_chars=run.export.max_chars,
            rules=run.export,
            meter=meter,
            budget=budget,
        )
    path, stats = generate_for_job(
        generation, out, out / PROMPTS, meter=meter, require_done=require_done, budget=budget
    )
    sort_generations(path, out / PROMPTS)  # the order every executor writes
    regeneration = None
    if chains_enabled(run):  # judge, then attempts 2..K (storyforge.jobs.regenerate)
        from storyforge.jobs.regenerate import regenerate

        path, regeneration = regenerate(
            generation,
            out,
            out / SEEDS,
            out / PROMPTS,
            path,
            run.regenerate,
            max_chars=run.export.max_chars,
            rules=run.export,
            meter=meter,
            judge=run.judge,
            require_done=require_done,
            budget=budget,
        )
    return path, stats, regeneration


def _pipelined(run: RunSettings, generation: GenerationSettings) -> bool:
    """Whether each chain's next attempt goes out as soon as the one before is checked
    (:func:`~storyforge.jobs.regenerate.regenerate_pipelined`): with attempts to make, no judge
    and one request per sample; otherwise the attempts are passes, one after the other (also
    with ``provider=llama_cpp``, whose server's context each pass sizes for its longest request)."""
    from storyforge.config.provider import LlamaCppProviderConf
    from storyforge.providers.choices import use_n

    conf = generation.provider
    return (
        run.regenerate.enabled
        and not run.judge.enabled
        and not use_n(conf)
        and not isinstance(conf, LlamaCppProviderConf)
    )


def cost_section(meter: CostMeter) -> Callable[[int], dict[str, Any]]:
    """The report's cost section for a given number of passing samples."""

    def section(passed: int) -> dict[str, Any]:
        return meter.summary(passed=passed)

    return section


# -- more than one shard: each its share of the limit, merged on the driver -------------------------


def shard_meters(meter: CostMeter, prompts: Sequence[int]) -> list[CostMeter]:
    """A fresh meter per shard, its limit the shard's share of ``meter``'s (by prompts); one
    shard spends on ``meter`` itself."""
    if len(prompts) == 1:
        return [meter]
    total = sum(prompts)
    limit = meter.limit
    return [
        meter.share(None if limit is None else limit * count / total if total else 0.0) for count in prompts
    ]


def merge_shard_chains(
    run: RunSettings,
    out: Path,
    dirs: Sequence[Path],
    shards: Sequence[Generated],
    positions: dict[str, int],
    *,
    limit: float | None,
) -> tuple[CostMeter, dict[str, Any] | None]:
    """On the driver: the shards' meters as one, and (with chains) their journals, attempt and
    judge files merged into ``out``; returns the meter and the merged regeneration figures.

    Raises :class:`BudgetExceeded` when a shard stopped at its share of the limit (nothing is
    merged then: the shards' journals are where a rerun goes on from)."""
    meter = CostMeter.combine([shard.meter for shard in shards], limit=limit)
    stopped = [shard.stopped for shard in shards if shard.stopped is not None]
    if stopped:
        raise BudgetExceeded(
            f"provider.max_cost_usd={limit:g} reached: ${meter.spent:.4f} spent on {meter.model} "
            f"({len(stopped)} of {len(shards)} shards reached their share of the limit); the answers "
            "so far are kept; rerun into the same directory with a higher provider.max_cost_usd to go on"
        )
    if not chains_enabled(run):
        return meter, None
    from storyforge.jobs.judge import judge_journal
    from storyforge.jobs.regenerate import ATTEMPTS, attempt_journal

    attempts = run.regenerate.max_attempts
    names = [GENERATIONS, *(attempt_journal(k) for k in range(2, attempts + 1))]
    if run.judge.enabled:
        names += [
            judge_journal(k, retry) for k in range(1, attempts + 1) for retry in range(run.judge.retries + 1)
        ]
    for name in [*names, ATTEMPTS]:
        # A file a pass wrote in some shard (a shard whose chains all passed sooner has none).
        sources = [d / name for d in dirs if (d / name).is_file()]
        if sources:
            merge_generations(out / name, sources, positions)
    figures = [shard.regeneration for shard in shards if shard.regeneration is not None]
    return meter, combine_regeneration(figures)


def combine_regeneration(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The regeneration figures of one run from its shards': per attempt (and per judge pass)
    the counts add up, as :func:`~storyforge.jobs.tinystories_shards.combine_stats` adds them."""
    first = parts[0]
    figures: dict[str, Any] = {
        "max_attempts": first["max_attempts"],
        "feedback": first["feedback"],
        "template": first["template"],
        "attempts": _by_pass([part["attempts"] for part in parts], ("attempt",)),
        "still_failing": sum(int(part["still_failing"]) for part in parts),
    }
    if "judge" in first:
        judges = [part["judge"] for part in parts]
        figures["judge"] = {
            "judge": judges[0]["judge"],
            "template": judges[0]["template"],
            "verdicts": {k: sum(int(j["verdicts"][k]) for j in judges) for k in judges[0]["verdicts"]},
            **{key: _sum_counts([j.get(key) or {} for j in judges]) for key in ("rules", "errors")},
            "passes": _by_pass([j["passes"] for j in judges], ("attempt", "retry")),
        }
    return figures


def _sum_counts(parts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for key, n in part.items():
            total[key] = total.get(key, 0) + int(n)
    return dict(sorted(total.items()))


def _by_pass(parts: Sequence[Sequence[Mapping[str, Any]]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each pass's stats (one entry per shard that made it) combined, in pass order."""
    passes: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for part in parts:
        for entry in part:
            passes.setdefault(tuple(int(entry[key]) for key in keys), []).append(dict(entry))
    return [combine_stats(passes[key]) for key in sorted(passes)]
