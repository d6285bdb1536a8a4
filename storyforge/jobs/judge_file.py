"""Judging an existing completions file: ``completions=FILE judge=NAME provider=...``.

Takes: the run's settings, its directory (seeds and prompts written) and the completions file.
Gives: :class:`JudgeFileUnit` and :func:`run_judge_file`, which sends one judge request per
answer of the file that passes its seed's rules (as a run's attempt 1 is judged, with
:class:`~storyforge.jobs.judge.JudgePass`) and writes :data:`JUDGED`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge.atomic import AtomicLines
from storyforge.config.settings import RunSettings
from storyforge.jobs.base import Report
from storyforge.jobs.judge import JudgePass, judge_provider_conf
from storyforge.providers.error_budget import ErrorBudget
from storyforge.providers.journal import encode_record
from storyforge.runfiles import PROMPTS, SEEDS

__all__ = ["JUDGED", "JudgeFileUnit", "run_judge_file"]

JUDGED = "completions.judged.jsonl"
"""The completions file with each judged answer's verdict: what the checks then read."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgeFileUnit:
    """Judge the answers of ``completions`` that pass their seed's rules, in the run directory ``dir``."""

    settings: RunSettings
    dir: Path
    completions: Path


def run_judge_file(unit: JudgeFileUnit, report: Report | None) -> dict[str, Any]:
    """Do one :class:`JudgeFileUnit`: one judge request per answer of the file that passes its
    seed's rules (as a run's attempt 1 is judged: journals, retries, cache, cost meter, error
    budget), then write :data:`JUDGED`: the file line for line (so line numbers still point
    into it), each answer as a ``generations.jsonl`` record of attempt 1 carrying its
    ``judge`` verdict, every other line (blank, malformed) as it was. Returns the judge's figures."""
    from storyforge.jobs.costing import plain_meter
    from storyforge.jobs.regenerate import load_seeds, passing_answers
    from storyforge.tasks.tinystories.completions import Completion, parse_completion_line

    run, out = unit.settings, unit.dir
    seeds = load_seeds(out / SEEDS, out / PROMPTS, max_chars=run.export.max_chars)
    first: dict[tuple[str, int], int] = {}
    records = []
    with unit.completions.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            item = parse_completion_line(raw, number)
            if isinstance(item, Completion) and (item.id, item.sample) not in first:
                first[(item.id, item.sample)] = number
                if item.error is None and isinstance(item.output, str):
                    records.append({"id": item.id, "sample": item.sample, "output": item.output})
    generation = run.generation
    judge_pass = JudgePass(
        generation,
        run.judge,
        out,
        out / PROMPTS,
        {seed_id: seed.record for seed_id, seed in seeds.items()},
        meter=plain_meter(judge_provider_conf(generation.provider, run.judge), run.pricing),
        budget=ErrorBudget(max_error_rate=generation.provider.max_error_rate, judged=True),
    )
    verdicts = judge_pass(1, passing_answers(records, seeds, run.export))
    with AtomicLines(out / JUDGED) as target, unit.completions.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            item = parse_completion_line(raw, number)
            if not isinstance(item, Completion):
                target.write_line(raw.rstrip(b"\r\n") + b"\n")
                continue
            key = (item.id, item.sample)
            record: dict[str, Any] = {
                "id": item.id,
                "sample": item.sample,
                "output": item.output,
                "finish_reason": item.finish_reason,
                "error": item.error,
                "attempt": 1,
                "final": True,
            }
            if first[key] == number and key in verdicts:
                record["judge"] = verdicts[key]
            target.write_line(encode_record(record))
    return judge_pass.summary()
