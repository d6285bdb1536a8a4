"""The judge pass: answers that passed the seed's rules go to a judge model for a structured verdict.

Takes: the generation settings, the :class:`~storyforge.config.judge.JudgeSettings`, the run
directory and the seeds (with their instructions). Gives: :func:`judge_provider_conf` (the
judge's provider: the generation provider with ``judge.provider`` overrides, one sample, the
judge's ``max_tokens`` and ``seed``) and :class:`JudgePass`, whose :meth:`JudgePass.judge`
sends one judge request per answer of an attempt and returns each answer's verdict record.

Every judge request goes through the providers' runner like a generation request (retries,
response cache, ``provider.replay``, the cost meter under stage ``judge``) and is journaled in
``judgements.jsonl`` (attempt 1) or ``judgements.attempt<k>.jsonl``; an answer whose verdict
is not valid under ``judge.schema`` is asked again with the next sampling seed, up to
``judge.retries`` times (``judgements[.attempt<k>].retry<r>.jsonl``), then recorded as a judge
error (``{"error": ...}``), never guessed. A rerun reads the journals and sends only what is
missing, so a judge added to a finished run (``stage=judge``) sends judge requests only.

Nothing about the judge is quiet: each pass logs one line (the terminal and ``run.log``) with
its verdicts, pass, fail and error, and the errors by kind; :meth:`JudgePass.summary` keeps
the counts, the rules the failing verdicts cite and the error kinds for the manifest; and
every judge error counts toward ``provider.max_error_rate`` over the run
(:mod:`storyforge.providers.error_budget`), which stops the run before any export is written
once the limit is certain to be passed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from storyforge.config.hydra_errors import unknown_fields_message
from storyforge.config.judge import JudgeSettings
from storyforge.config.provider import (
    GenerationSettings,
    OllamaProviderConf,
    OpenAIProviderConf,
    ProviderConf,
)
from storyforge.errors import ConfigError, DataError
from storyforge.jobs.order import sort_generations
from storyforge.providers.base import ChatRequest, Provider
from storyforge.providers.cost import CostMeter
from storyforge.providers.error_budget import ErrorBudget
from storyforge.providers.journal import read_records
from storyforge.providers.structured import StructuredProvider, structured_fields
from storyforge.tasks.tinystories.judge import JudgeRenderer, Verdict, error_kind, read_verdict

__all__ = [
    "JudgePass",
    "judge_journal",
    "judge_provider_conf",
    "verdict_line",
]

log = logging.getLogger(__name__)

Answer = tuple[str, int, str]
"""(seed id, chain sample, the answer's text)."""


def judge_journal(attempt: int, retry: int) -> str:
    base = "judgements" if attempt == 1 else f"judgements.attempt{attempt}"
    return f"{base}.jsonl" if retry == 0 else f"{base}.retry{retry}.jsonl"


def judge_provider_conf(base: ProviderConf, judge: JudgeSettings) -> ProviderConf:
    """The generation provider with the judge's overrides, checked and sealed."""
    overrides: dict[str, Any] = dict(judge.provider)
    overrides.update(samples=1, n_per_request=False)
    if isinstance(base, OpenAIProviderConf):
        overrides.setdefault("max_tokens", judge.max_tokens)
        overrides.setdefault("seed", judge.seed)
    elif isinstance(base, OllamaProviderConf):
        options = {**base.options, **dict(overrides.get("options") or {})}
        if judge.max_tokens is not None:
            options.setdefault("num_predict", judge.max_tokens)
        options.setdefault("seed", judge.seed)
        overrides["options"] = options
    known = [f.name for f in dataclasses.fields(base) if f.init]
    unknown = sorted(set(judge.provider) - set(known))
    if unknown:
        raise ConfigError(
            unknown_fields_message(f"judge.provider.{unknown[0]}", unknown, known, "judge.provider")
        )
    conf = dataclasses.replace(base, **overrides)
    conf.check()
    return conf.seal()


class JudgePass:
    """Judges the answers of each attempt (see the module docstring)."""

    def __init__(
        self,
        generation: GenerationSettings,
        judge: JudgeSettings,
        out_dir: Path,
        prompts_path: Path,
        seeds: Mapping[str, Mapping[str, Any]],
        *,
        meter: CostMeter | None = None,
        budget: ErrorBudget | None = None,
    ) -> None:
        conf = judge_provider_conf(generation.provider, judge)
        self.settings = dataclasses.replace(generation, provider=conf)
        self.stride = generation.provider.samples
        self.judge = judge
        self.schema = judge.schema
        self.renderer = JudgeRenderer.load(judge.template)
        fields = structured_fields(judge.structured_output, conf.name, self.schema)
        self._wrap = lambda provider: StructuredProvider(provider, fields)
        self.out_dir = out_dir
        self.prompts_path = prompts_path
        self.seeds = seeds
        self.meter = meter
        self.budget = budget
        self.counts: Counter[str] = Counter()
        self.rules: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.passes: list[dict[str, Any]] = []

    def __call__(self, attempt: int, answers: list[Answer]) -> dict[tuple[str, int], dict[str, Any]]:
        """Each answer's verdict record (``verdict``, ``rule``, ``reason``) or ``{"error": ...}``."""
        from storyforge.providers.runner import generate_for_job

        verdicts: dict[tuple[str, int], dict[str, Any]] = {}
        problems: dict[tuple[str, int], str] = {}
        counts: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        pending = answers
        for retry in range(self.judge.retries + 1):
            if not pending:
                break
            shift = retry * self.stride  # the retry's own sampling seeds

            def source(
                provider: Provider, pending: list[Answer] = pending, shift: int = shift
            ) -> Iterator[Any]:
                for seed_id, sample, answer in pending:
                    seed = self.seeds[seed_id]
                    split = seed.get("split")
                    request = ChatRequest(
                        id=seed_id,
                        split=split if isinstance(split, str) else None,
                        sample=sample + shift,
                        messages=self.renderer(seed, answer),
                    )
                    try:
                        yield request, provider.body(request)
                    except DataError as exc:
                        yield str(exc)

            path, stats = generate_for_job(
                self.settings,
                self.out_dir,
                self.prompts_path,
                source=source,
                journal_name=judge_journal(attempt, retry),
                meter=self.meter,
                stage="judge",
                wrap=self._wrap,
                budget=self.budget,
            )
            sort_generations(path, self.prompts_path)  # the order every executor writes
            self.passes.append({"attempt": attempt, "retry": retry, **stats})
            records = {(str(r["id"]), int(r["sample"]) - shift): r for r in read_records(path)}
            still: list[Answer] = []
            for item in pending:
                key = (item[0], item[1])
                record = records.get(key)
                if record is None:
                    continue
                if record.get("error") is not None:
                    problems[key] = f"the judge request failed: {record['error']}"
                else:
                    verdict = read_verdict(record.get("output"), self.schema)
                    if isinstance(verdict, Verdict):
                        verdicts[key] = verdict.as_record()
                        counts["pass" if verdict.passed else "fail"] += 1
                        if not verdict.passed:
                            self.rules[verdict.rule] += 1
                        continue
                    problems[key] = verdict
                still.append(item)
            pending = still
        for seed_id, sample, _answer in pending:
            key = (seed_id, sample)
            verdicts[key] = {
                "error": f"no valid verdict after {self.judge.retries + 1} request(s): {problems[key]}"
            }
            counts["error"] += 1
            kinds[error_kind(problems[key])] += 1
        self.counts.update(counts)
        self.errors.update(kinds)
        if answers:
            line = verdict_line(f"judge, attempt {attempt}", counts, kinds)
            (log.warning if counts["error"] else log.info)("%s", line)
        if self.budget is not None:
            self.budget.judge_pass(len(answers), counts["error"])  # may stop the run
        return verdicts

    def summary(self) -> dict[str, Any]:
        return {
            "judge": self.judge.name,
            "template": self.renderer.name,
            "verdicts": {k: self.counts.get(k, 0) for k in ("pass", "fail", "error")},
            "rules": dict(sorted(self.rules.items())),
            "errors": dict(sorted(self.errors.items())),
            "passes": self.passes,
        }


def verdict_line(what: str, verdicts: Mapping[str, int], errors: Mapping[str, int]) -> str:
    """One line of a judge pass's verdicts, e.g. ``judge, attempt 1: 4 answer(s): pass 1, fail 0,
    error 3 (not JSON: 3)``."""
    counts = {k: int(verdicts.get(k, 0)) for k in ("pass", "fail", "error")}
    line = f"{what}: {sum(counts.values())} answer(s): " + ", ".join(f"{k} {n}" for k, n in counts.items())
    if errors:
        line += " (" + ", ".join(f"{kind}: {n}" for kind, n in sorted(errors.items())) + ")"
    return line
