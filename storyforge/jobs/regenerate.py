"""Regeneration: a sample whose answer fails its checks is asked again, up to K attempts in all.

Takes: the run directory after the first generation pass (``prompts_seed.jsonl``,
``prompts.jsonl``, ``generations.jsonl`` sorted by prompt then sample), the
:class:`~storyforge.config.regenerate.RegenerateConf`, and the run config the providers'
runner reads (:class:`~storyforge.config.provider.GenerationSettings`). Gives:
:func:`regenerate`, which writes ``generations.attempt<k>.jsonl`` for k = 2..K and
``attempts.jsonl`` (every attempt of every chain, in prompt, sample, attempt order), and
returns that file's path with the figures for the manifest.

How a chain goes: sample ``s`` of seed ``id`` is one chain. Attempt 1 is its line of
``generations.jsonl``. An attempt whose text fails the seed's checks, or that came back
empty, is followed by attempt k+1; a passing one ends the chain, and so does a failed request
(a provider error, which the runner already retried; ``provider.retry_errors`` asks again on
a rerun). Attempt k+1 is sent as:

* ``feedback=true``: the original messages, the failed answer as an assistant turn, and a
  user turn rendered by the engine from the repair template (what failed, in words);
* ``feedback=false``: the original messages again.

Either way it carries sampling seed number ``s + (k-1) * samples`` (``provider.seed`` plus
that number), so no two attempts of a run share a seed. A request identical to the one that
just failed (``feedback=false`` with no ``provider.seed``) would only get the same answer back
from the cache, so it is refused with a ConfigError.

Two ways to run the attempts, with the same files in the end:

* :func:`regenerate_pipelined` (no judge, one request per sample: the common case): a chain's
  attempt k+1 is queued as soon as attempt k is answered and checked, and sent within the same
  ``provider.concurrency`` as every other request
  (:func:`~storyforge.providers.runner.generate_chains`), so the server never idles while the
  slowest answers of an attempt come in;
* :func:`regenerate` (with a judge, or ``n=`` per request): attempt by attempt, each a
  generation pass of its own after the one before has finished.

Exactly once: every attempt is journaled in its own file, so the runner's journal rules hold
per attempt (a rerun keeps what is done, sends only the rest; ``kill -9`` loses at most the
last 50 ms). The checks are deterministic, and an attempt is only ever journaled after the
attempt before it, so a rerun rebuilds exactly the same requests for what is left. The
response cache and ``provider.replay`` apply to every attempt as to the first. Each journal
is sorted (by prompt, then sample) once the chains are done, so the files do not depend on
the order the answers came in.

Memory: only the chains still failing after an attempt are kept (their last answer), not the
passing ones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.atomic import AtomicLines
from storyforge.config.judge import JudgeSettings
from storyforge.config.provider import GenerationSettings
from storyforge.config.regenerate import RegenerateConf
from storyforge.config.settings import SAME_REQUEST_AGAIN
from storyforge.errors import ConfigError, DataError
from storyforge.jobs.order import sort_generations
from storyforge.providers.base import ChatRequest, Provider, content_hash, encode_body
from storyforge.providers.cost import CostMeter
from storyforge.providers.error_budget import ErrorBudget
from storyforge.providers.journal import encode_record, read_records
from storyforge.runfiles import ATTEMPTS
from storyforge.tasks.tinystories.echo import REASON_PREFIX
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.provenance import attempt_journal
from storyforge.tasks.tinystories.repair import RepairRenderer, repair_context
from storyforge.tasks.tinystories.validate import SeedChecks, ValidationResult, check_answer, prompt_texts

__all__ = [
    "ATTEMPTS",
    "Chain",
    "attempt_journal",
    "load_seeds",
    "passing_answers",
    "regenerate",
    "regenerate_pipelined",
    "repair_turn",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Chain:
    """A chain still failing: its key, its last attempt's answer and why it failed."""

    id: str
    sample: int
    attempt: int
    output: object
    labels: tuple[str, ...]
    request_hash: str
    # The judge's rule and reason when the rules passed but the judge failed the answer.
    judge_rule: str = ""
    judge_reason: str = ""
    # How the answer ended, and the span of its prompt it repeated ("" if none).
    finish_reason: str | None = None
    echo: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Seed:
    record: dict[str, Any]
    checks: SeedChecks
    split: str | None
    messages: tuple[Mapping[str, Any], ...]


def load_seeds(seeds_path: Path, prompts_path: Path, *, max_chars: int) -> dict[str, _Seed]:
    """The run's seeds with their checks and prompt, by id (a seed without checks is left out)."""
    prompts: dict[str, tuple[Mapping[str, Any], ...]] = {}
    for _, record in jsontext.read_jsonl(prompts_path):  # a BadLine is no prompt
        if isinstance(record, dict) and isinstance(record.get("id"), str):
            prompts.setdefault(record["id"], tuple(record.get("messages") or ()))
    seeds: dict[str, _Seed] = {}
    for _, record in jsontext.read_jsonl(seeds_path):  # a BadLine is no seed
        seed_id = record.get("id") if isinstance(record, dict) else None
        if not isinstance(seed_id, str) or seed_id not in prompts:
            continue
        try:
            checks = SeedChecks.from_seed(record, max_chars=max_chars)
        except DataError:
            continue  # the completion stage reports it as a bad seed
        split = record.get("split")
        seeds[seed_id] = _Seed(
            record=record,
            checks=checks,
            split=split if isinstance(split, str) else None,
            messages=prompts[seed_id],
        )
    return seeds


def _checked(
    record: Mapping[str, Any], seed: _Seed, rules: ExportOptions, repair_turn: str | None
) -> ValidationResult:
    """The verdict on ``record``'s answer as the completion stage gives it (the seed's rules,
    cut off, echo of the messages it answered: the seed's prompt and ``repair_turn``)."""
    finish = record.get("finish_reason")
    return check_answer(
        seed.checks,
        record.get("output"),
        finish_reason=finish if isinstance(finish, str) else None,
        prompts=prompt_texts(seed.messages, repair_turn),
        echo_words=rules.echo_words,
        max_tokens=rules.max_tokens,
    )


def _failing(
    record: Mapping[str, Any],
    seed: _Seed | None,
    attempt: int,
    verdict: Mapping[str, Any] | None = None,
    *,
    rules: ExportOptions,
    repair_turn: str | None = None,
) -> Chain | None:
    """The chain to continue after ``record``, or None (it passed, errored or has no seed).

    An answer that passed the rules fails when the judge failed it (label ``other``); a judge
    error ends the chain (the answer is not the judge's to repair)."""
    if seed is None or record.get("error") is not None:
        return None
    output = record.get("output")
    result = _checked(record, seed, rules, repair_turn)
    rule = reason = ""
    if result.passed:
        if verdict is None or verdict.get("verdict") != "fail":
            return None
        labels: tuple[str, ...] = ("other",)
        rule, reason = str(verdict.get("rule", "")), str(verdict.get("reason", ""))
    else:
        labels = result.labels
    finish = record.get("finish_reason")
    return Chain(
        id=str(record["id"]),
        sample=int(record["sample"]),
        attempt=attempt,
        output=output,
        labels=labels,
        request_hash=str(record.get("request_hash")),
        judge_rule=rule,
        judge_reason=reason,
        finish_reason=finish if isinstance(finish, str) else None,
        echo=next((r for r in result.reasons if r.startswith(REASON_PREFIX)), ""),
    )


def passing_answers(
    records: list[dict[str, Any]],
    seeds: Mapping[str, _Seed],
    rules: ExportOptions,
    repairs: Mapping[tuple[str, int], str] | None = None,
) -> list[tuple[str, int, str]]:
    """The answers of ``records`` that pass their seed's rules (and are whole, and no echo):
    what the judge is asked about. ``repairs``: the repair turn each chain answered."""
    answers = []
    for record in records:
        seed = seeds.get(str(record.get("id")))
        output = record.get("output")
        if seed is None or record.get("error") is not None or not isinstance(output, str):
            continue
        key = (str(record["id"]), int(record["sample"]))
        if _checked(record, seed, rules, (repairs or {}).get(key)).passed:
            answers.append((*key, output))
    return answers


def _next_messages(chain: Chain, seed: _Seed, repair_turn: str | None) -> tuple[Mapping[str, Any], ...]:
    """The next attempt's messages: the repair conversation, or the prompt again (no feedback)."""
    if repair_turn is None:
        return seed.messages
    failed = chain.output if isinstance(chain.output, str) else ""
    return (
        *seed.messages,
        {"role": "assistant", "content": failed},
        {"role": "user", "content": repair_turn},
    )


def _repair_text(chain: Chain, seed: _Seed, repair: RepairRenderer) -> str:
    context = repair_context(
        seed.record,
        seed.checks,
        chain.output,
        chain.labels,
        attempt=chain.attempt,
        judge_rule=chain.judge_rule,
        judge_reason=chain.judge_reason,
        finish_reason=chain.finish_reason,
        echo=chain.echo,
    )
    return repair(context)


def repair_turn(
    seed: Mapping[str, Any],
    failed: Mapping[str, Any],
    repair: RepairRenderer,
    *,
    max_chars: int,
    verdict: Mapping[str, Any] | None = None,
    rules: ExportOptions | None = None,
    messages: tuple[Mapping[str, Any], ...] = (),
) -> str | None:
    """The repair user turn sent after ``failed`` (an ``attempts.jsonl`` record of ``seed``'s
    chain, with its ``attempt`` and the ``repair_turn`` it answered; ``verdict`` the judge's
    record of it; ``messages`` the seed's prompt), as the job renders it; None when that
    attempt asked for no repair (it passed, or its request failed).

    Raises DataError when the seed's constraints do not make checks."""
    attempt = failed.get("attempt")
    number = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1
    record = dict(seed)
    checks = SeedChecks.from_seed(record, max_chars=max_chars)
    entry = _Seed(record=record, checks=checks, split=None, messages=messages)
    answered = failed.get("repair_turn")
    chain = _failing(
        failed,
        entry,
        number,
        verdict,
        rules=rules or ExportOptions(max_chars=max_chars),
        repair_turn=answered if isinstance(answered, str) else None,
    )
    return _repair_text(chain, entry, repair) if chain is not None else None


def regenerate(
    generation: GenerationSettings,
    out_dir: Path,
    seeds_path: Path,
    prompts_path: Path,
    generations_path: Path,
    settings: RegenerateConf,
    *,
    max_chars: int,
    meter: CostMeter | None = None,
    judge: JudgeSettings | None = None,
    require_done: str | None = None,
    budget: ErrorBudget | None = None,
    rules: ExportOptions | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Run attempts 2..K for every failing chain (with ``judge``, judging each attempt's answers
    that pass the rules first); write ``attempts.jsonl``; return it and figures.

    ``require_done`` (``stage=judge``): every generation attempt must already be journaled.
    ``budget``: the run's error budget, told of every pass (see
    :mod:`storyforge.providers.error_budget`).
    ``rules``: the echo rule and completion cap the answers are checked with (``export``)."""
    settings.check()  # settings built in code meet the group's rules as a run's config does
    rules = rules or ExportOptions(max_chars=max_chars)
    from storyforge.providers.runner import generate_for_job

    samples = generation.provider.samples
    seeds = load_seeds(seeds_path, prompts_path, max_chars=max_chars)
    repair = RepairRenderer.load(settings.template_file) if settings.feedback else None
    judge_pass = None
    if judge is not None and judge.enabled:
        from storyforge.jobs.judge import JudgePass

        judge_pass = JudgePass(
            generation,
            judge,
            out_dir,
            prompts_path,
            {seed_id: seed.record for seed_id, seed in seeds.items()},
            meter=meter,
            budget=budget,
        )
    verdicts: dict[tuple[int, str, int], dict[str, Any]] = {}
    # (attempt, id, sample) -> the repair turn that attempt answered (feedback=true)
    sent: dict[tuple[int, str, int], str] = {}

    def judged(
        attempt: int, records: list[dict[str, Any]], repairs: Mapping[tuple[str, int], str] | None = None
    ) -> None:
        if judge_pass is not None:
            answers = passing_answers(records, seeds, rules, repairs)
            for (seed_id, sample), verdict in judge_pass(attempt, answers).items():
                verdicts[(attempt, seed_id, sample)] = verdict

    first = read_records(generations_path)
    judged(1, first)
    failing: dict[tuple[str, int], Chain] = {}
    for record in first:
        key = (str(record.get("id")), int(record.get("sample", 0)))
        chain = _failing(record, seeds.get(key[0]), 1, verdicts.get((1, *key)), rules=rules)
        if chain is not None:
            failing[(chain.id, chain.sample)] = chain
    del first
    order = {seed_id: index for index, seed_id in enumerate(seeds)}
    rounds: list[dict[str, Any]] = []
    for attempt in range(2, settings.max_attempts + 1):
        if not failing:
            break
        todo = sorted(failing.values(), key=lambda c: (order[c.id], c.sample))
        shift = (attempt - 1) * samples
        if budget is not None:
            budget.attempt = attempt
        repairs = (
            {(c.id, c.sample): _repair_text(c, seeds[c.id], repair) for c in todo}
            if repair is not None
            else {}
        )
        sent.update(((attempt, *key), text) for key, text in repairs.items())

        def source(
            provider: Provider,
            todo: list[Chain] = todo,
            shift: int = shift,
            repairs: dict[tuple[str, int], str] = repairs,
        ) -> Iterator[Any]:
            for chain in todo:
                repair_turn = repairs.get((chain.id, chain.sample))
                yield _request(provider, chain, seeds[chain.id], settings, repair_turn, shift)

        path, stats = generate_for_job(
            generation,
            out_dir,
            prompts_path,
            source=source,
            journal_name=attempt_journal(attempt),
            meter=meter,
            stage="regeneration",
            require_done=require_done,
            budget=budget,
        )
        sort_generations(path, prompts_path)  # the order every executor writes
        stats["attempt"] = attempt
        rounds.append(stats)
        answers = [
            {**record, "sample": int(record["sample"]) - shift}
            for record in read_records(path)
            if (str(record["id"]), int(record["sample"]) - shift) in failing
        ]
        judged(attempt, answers, repairs)
        answered: dict[tuple[str, int], Chain | None] = {}
        for record in answers:
            key = (str(record["id"]), int(record["sample"]))
            answered[key] = _failing(
                record,
                seeds.get(key[0]),
                attempt,
                verdicts.get((attempt, *key)),
                rules=rules,
                repair_turn=repairs.get(key),
            )
        failing = {key: chain for key, chain in answered.items() if chain is not None}
        log.info("attempt %d: %d of %d chains still failing", attempt, len(failing), len(todo))
    merged = write_attempts(out_dir, generations_path, samples, settings.max_attempts, verdicts, sent)
    figures: dict[str, Any] = {
        "max_attempts": settings.max_attempts,
        "feedback": settings.feedback,
        "template": repair.name if repair is not None else None,
        "attempts": rounds,
        "still_failing": len(failing),
    }
    if judge_pass is not None:
        figures["judge"] = judge_pass.summary()
    return merged, figures


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rules:
    """The chains' rules for :func:`~storyforge.providers.runner.generate_chains`: the same
    checks as :func:`regenerate` (``rules``: the echo rule and completion cap)."""

    seeds: Mapping[str, _Seed]
    settings: RegenerateConf
    rules: ExportOptions
    repair: RepairRenderer | None
    samples: int
    first: str
    """Attempt 1's journal (``generations.jsonl``)."""
    sent: dict[tuple[int, str, int], str] = field(default_factory=dict)
    """(attempt, id, chain sample) -> the repair turn that attempt answered (feedback=true);
    filled as each request is made, also for the chains a rerun rebuilds from the journals."""

    @property
    def attempts(self) -> int:
        return self.settings.max_attempts

    def journal(self, attempt: int) -> str:
        return self.first if attempt == 1 else attempt_journal(attempt)

    def failing(self, record: Mapping[str, Any], attempt: int) -> tuple[Chain | None, _Seed | None]:
        """``record`` (an answer of ``attempt``, its journal's sample) checked: the chain to
        continue (None when it passed, errored or has no seed) and its seed."""
        shift = (attempt - 1) * self.samples
        answer = {**record, "sample": int(record["sample"]) - shift} if shift else record
        seed = self.seeds.get(str(record.get("id")))
        turn = self.sent.get((attempt, str(answer.get("id")), int(answer["sample"])))
        return _failing(answer, seed, attempt, rules=self.rules, repair_turn=turn), seed

    def next_request(
        self, provider: Provider, record: dict[str, Any], attempt: int
    ) -> tuple[ChatRequest, dict[str, Any]] | str | None:
        chain, seed = self.failing(record, attempt)
        if chain is None or seed is None or attempt >= self.settings.max_attempts:
            return None
        turn = _repair_text(chain, seed, self.repair) if self.repair is not None else None
        if turn is not None:
            self.sent[(attempt + 1, chain.id, chain.sample)] = turn
        return _request(provider, chain, seed, self.settings, turn, attempt * self.samples)


def _request(
    provider: Provider,
    chain: Chain,
    seed: _Seed,
    settings: RegenerateConf,
    repair_turn: str | None,
    shift: int,
) -> tuple[ChatRequest, dict[str, Any]] | str:
    """The request of ``chain``'s next attempt (sampling seed number ``sample + shift``), the
    repair conversation ending in ``repair_turn`` (None: the prompt again)."""
    request = ChatRequest(
        id=chain.id,
        split=seed.split,
        sample=chain.sample + shift,
        messages=_next_messages(chain, seed, repair_turn),
    )
    try:
        body = provider.body(request)
    except DataError as exc:
        return str(exc)
    if not settings.feedback and content_hash(encode_body(body)) == chain.request_hash:
        raise ConfigError(SAME_REQUEST_AGAIN)
    return request, body


def regenerate_pipelined(
    generation: GenerationSettings,
    out_dir: Path,
    seeds_path: Path,
    prompts_path: Path,
    settings: RegenerateConf,
    *,
    max_chars: int,
    meter: CostMeter | None = None,
    budget: ErrorBudget | None = None,
    rules: ExportOptions | None = None,
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Attempt 1 and attempts 2..K of every chain without a judge, each attempt sent as soon as
    the one before it is answered and checked (no pass waits for the slowest answers of the
    one before); the same journals, sorted, and ``attempts.jsonl`` as :func:`regenerate` after
    the first pass. Returns ``attempts.jsonl``, attempt 1's figures and the regeneration's.
    ``rules``: the echo rule and completion cap the answers are checked with (``export``)."""
    from storyforge.providers.runner import GENERATIONS_NAME, generate_chains

    settings.check()
    samples = generation.provider.samples
    seeds = load_seeds(seeds_path, prompts_path, max_chars=max_chars)
    repair = RepairRenderer.load(settings.template_file) if settings.feedback else None
    chains = _Rules(
        seeds=seeds,
        settings=settings,
        rules=rules or ExportOptions(max_chars=max_chars),
        repair=repair,
        samples=samples,
        first=GENERATIONS_NAME,
    )
    journals = generate_chains(generation, out_dir, prompts_path, chains, meter=meter, budget=budget)
    rounds: list[dict[str, Any]] = []
    for attempt, (path, stats) in enumerate(journals, start=1):
        sort_generations(path, prompts_path)  # the order every executor writes
        if attempt > 1:
            rounds.append({**stats, "attempt": attempt})
    still = 0
    if len(journals) == settings.max_attempts and settings.max_attempts > 1:
        for record in read_records(journals[-1][0]):
            still += chains.failing(record, settings.max_attempts)[0] is not None
    for entry in rounds:
        log.info("attempt %d: %d chains", entry["attempt"], entry["total"])
    merged = write_attempts(out_dir, journals[0][0], samples, settings.max_attempts, repairs=chains.sent)
    figures: dict[str, Any] = {
        "max_attempts": settings.max_attempts,
        "feedback": settings.feedback,
        "template": repair.name if repair is not None else None,
        "attempts": rounds,
        "still_failing": still,
    }
    return merged, journals[0][1], figures


def write_attempts(
    out_dir: Path,
    generations_path: Path,
    samples: int,
    max_attempts: int,
    verdicts: Mapping[tuple[int, str, int], Mapping[str, Any]] | None = None,
    repairs: Mapping[tuple[int, str, int], str] | None = None,
) -> Path:
    """``attempts.jsonl``: each chain's attempts in order after its first, each line a
    generations record with its chain sample, ``attempt``, ``chain``, ``final``, for an
    attempt sent as a repair conversation the ``repair_turn`` it answered and, for a judged
    answer, the judge's ``judge`` verdict record."""
    later: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for attempt in range(2, max_attempts + 1):
        path = out_dir / attempt_journal(attempt)
        shift = (attempt - 1) * samples
        for record in read_records(path):
            key = (str(record["id"]), int(record["sample"]) - shift)
            later.setdefault(key, []).append({**record, "sample": key[1], "attempt": attempt})
    target = out_dir / ATTEMPTS
    with AtomicLines(target) as out:
        for record in read_records(generations_path):
            key = (str(record["id"]), int(record["sample"]))
            chain = [{**record, "attempt": 1}, *sorted(later.get(key, ()), key=lambda r: r["attempt"])]
            # Keep the chain's attempts only while they follow on from each other (1, 2, 3, ...).
            chain = [r for index, r in enumerate(chain) if r["attempt"] == index + 1]
            for index, item in enumerate(chain):
                item["chain"] = f"{key[0]}#{key[1]}"
                item["final"] = index == len(chain) - 1
                turn = (repairs or {}).get((item["attempt"], *key))
                if turn is not None:
                    item["repair_turn"] = turn
                verdict = (verdicts or {}).get((item["attempt"], *key))
                if verdict is not None:
                    item["judge"] = dict(verdict)
                out.write_line(encode_record(item))
    return target
