"""The completion stage: seeds + prompts + a completion file -> validated data sets and a report.

Takes: the run config (``export`` group, root ``strict``), the run directory, and the paths of
``prompts_seed.jsonl`` (the checks), ``prompts.jsonl`` (the chat messages each seed was sent
as; a seed missing there falls back to one user turn holding its ``instruction``) and a
completion file (see :mod:`storyforge.tasks.tinystories.completions`). Gives: in ``out_dir``

* ``validated.jsonl``: every usable completion with its verdict, its text and any provider error;
* ``sft.jsonl`` / ``rejects.jsonl``: passing completions as chats / failing ones with reasons;
* ``dpo.jsonl``: preference pairs chosen by ``export.dpo_pairing``;
* ``completion_errors.jsonl``: every line that could not be used (malformed, unknown id,
  duplicate id+sample, invalid seed) with its line number and why;
* ``<name>.parquet`` beside each of those JSONL files: the same rows under a fixed schema
  (:mod:`storyforge.tasks.tinystories.tables`), so an empty export still loads;
* ``report/``: summary.json, summary.md and plots;

and returns the summary mapping that the job merges into the run manifest.

Why one streaming pass: completion files can hold millions of outputs, so each line is
validated and written as it is read; only offsets of DPO candidates and small per-seed counts
stay in memory. Every file is written to a temp file and replaced at the end, so an
interrupted or failed run leaves the previous outputs untouched, and a rerun rewrites them
whole (no duplicates, no gaps). With ``strict=true`` the first bad line or seed stops the run
with a :class:`DataError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from storyforge.atomic import AtomicLines
from storyforge.errors import DataError
from storyforge.tasks.tinystories.completions import (
    Completion,
    LineProblem,
    read_completions,
)
from storyforge.tasks.tinystories.exports import (
    ExportOptions,
    Message,
    PairCollector,
    chat_messages,
    dpo_record,
    reject_record,
    sft_record,
)
from storyforge.tasks.tinystories.report import PLOTS, ValidationStats, headline_table, write_report
from storyforge.tasks.tinystories.tables import parquet_path, write_parquet
from storyforge.tasks.tinystories.validate import SeedChecks

__all__ = ["PROBLEM_KINDS", "SeedEntry", "load_prompts", "load_seeds", "process_completions"]

log = logging.getLogger(__name__)

PROBLEM_KINDS = ("malformed", "unknown_id", "duplicate", "bad_seed")

OUTPUT_FILES = {
    "validated": "validated.jsonl",
    "sft": "sft.jsonl",
    "rejects": "rejects.jsonl",
    "dpo": "dpo.jsonl",
    "completion_errors": "completion_errors.jsonl",
    "report": "report/summary.json",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedEntry:
    """What the stage needs of one seed: its checks, grouping fields and prompt turns."""

    checks: SeedChecks
    split: str | None
    theme: str
    prompt: tuple[Message, ...]


def _records(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed JSON or None, problem message or None) for each non-blank line."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw), None
            except ValueError as exc:
                yield number, None, f"not valid JSON: {exc}"


def load_prompts(
    path: Path | None, *, strict: bool
) -> tuple[dict[str, tuple[Message, ...]], list[dict[str, Any]]]:
    """``prompts.jsonl`` as id -> prompt turns, plus the lines that could not be used."""
    prompts: dict[str, tuple[Message, ...]] = {}
    problems: list[dict[str, Any]] = []
    if path is None or not path.exists():
        return prompts, problems
    for line, record, error in _records(path):
        seed_id = record.get("id") if isinstance(record, dict) else None
        try:
            if error is not None:
                raise DataError(error)
            if not isinstance(seed_id, str):
                raise DataError(f"expected an object with a string 'id', got {record!r:.80}")
            if seed_id in prompts:
                raise DataError(f"duplicate prompt id {seed_id!r}")
            prompts[seed_id] = chat_messages(record.get("messages"), where=f"prompt {seed_id!r}")
        except DataError as exc:
            if strict:
                raise DataError(f"{path}:{line}: {exc}") from None
            problems.append({"file": path.name, "line": line, "id": seed_id, "message": str(exc)})
    return prompts, problems


def load_seeds(
    path: Path,
    prompts: Mapping[str, tuple[Message, ...]],
    *,
    max_chars: int,
    strict: bool,
) -> tuple[dict[str, SeedEntry], dict[str, str], list[dict[str, Any]]]:
    """``prompts_seed.jsonl`` as id -> :class:`SeedEntry`, ids of invalid seeds -> why, problems.

    A seed is invalid when its checks cannot be built, or when it has neither a prompt in
    ``prompts`` nor an ``instruction`` to stand in for one.
    """
    if not path.is_file():
        raise DataError(f"seed file {path} does not exist")
    seeds: dict[str, SeedEntry] = {}
    invalid: dict[str, str] = {}
    problems: list[dict[str, Any]] = []
    for line, record, error in _records(path):
        seed_id = record.get("id") if isinstance(record, dict) else None
        try:
            if error is not None:
                raise DataError(error)
            if not isinstance(record, dict) or not isinstance(seed_id, str) or not seed_id:
                raise DataError(f"expected an object with a non-empty string 'id', got {record!r:.80}")
            if seed_id in seeds or seed_id in invalid:
                raise DataError(f"duplicate seed id {seed_id!r}")
            checks = SeedChecks.from_seed(record, max_chars=max_chars)
            prompt = prompts.get(seed_id)
            if prompt is None:
                instruction = record.get("instruction")
                if not isinstance(instruction, str) or not instruction:
                    raise DataError(f"seed {seed_id!r} has no prompt in prompts.jsonl and no 'instruction'")
                prompt = ({"role": "user", "content": instruction},)
            split = record.get("split")
            seeds[seed_id] = SeedEntry(
                checks=checks,
                split=split if isinstance(split, str) else None,
                theme=str(record.get("theme", "")),
                prompt=prompt,
            )
        except DataError as exc:
            if strict:
                raise DataError(f"{path}:{line}: {exc}") from None
            message = f"{path.name} line {line}: {exc}"
            problems.append({"file": path.name, "line": line, "id": seed_id, "message": str(exc)})
            if isinstance(seed_id, str) and seed_id not in seeds:
                invalid.setdefault(seed_id, message)
    return seeds, invalid, problems


class _ProblemLog:
    """Counts problem lines per kind, lists the first few, streams all to completion_errors.jsonl."""

    def __init__(self, writer: AtomicLines, *, listed: int, strict: bool, source: Path) -> None:
        self._writer = writer
        self._listed = listed
        self._strict = strict
        self._source = source
        self.kinds: dict[str, dict[str, Any]] = {
            kind: {"count": 0, "lines": [], "more": 0} for kind in PROBLEM_KINDS
        }

    def add(self, problem: LineProblem) -> None:
        if self._strict:
            raise DataError(f"{self._source}:{problem.line}: {problem.kind}: {problem.message}")
        entry = self.kinds[problem.kind]
        entry["count"] += 1
        if len(entry["lines"]) < self._listed:
            entry["lines"].append(problem.line)
        else:
            entry["more"] += 1
        self._writer.write(problem.as_record())


def _check_inputs(seeds_path: Path, completions_path: Path) -> None:
    if not completions_path.is_file():
        raise DataError(f"completions file {completions_path} does not exist (config key: completions)")
    if not seeds_path.is_file():
        raise DataError(f"seed file {seeds_path} does not exist")


def process_completions(
    cfg: Mapping[str, Any] | None,
    out_dir: Path,
    seeds_path: Path,
    prompts_path: Path | None,
    completions_path: Path,
) -> dict[str, Any]:
    """Validate every completion against its seed and write the data sets and the report.

    Returns the summary (also written to ``report/summary.json``). Raises
    :class:`DataError` for a missing input file, and in ``strict`` mode for the first bad
    seed or completion line; :class:`ConfigError` for a bad ``export`` option.
    """
    options = ExportOptions.from_config(cfg)
    out_dir = Path(out_dir)
    completions_path = Path(completions_path)
    _check_inputs(Path(seeds_path), completions_path)
    prompts, prompt_problems = load_prompts(
        Path(prompts_path) if prompts_path else None, strict=options.strict
    )
    seeds, invalid, seed_problems = load_seeds(
        Path(seeds_path), prompts, max_chars=options.max_chars, strict=options.strict
    )
    from_instruction = sum(1 for seed_id in seeds if seed_id not in prompts)
    if from_instruction:
        log.warning(
            "%d of %d seeds have no prompt in %s; their SFT/DPO prompt is the seed's instruction",
            from_instruction,
            len(seeds),
            prompts_path,
        )
    out_dir.mkdir(parents=True, exist_ok=True)

    stats = ValidationStats()
    collector = PairCollector(options.dpo_pairing)
    seen: dict[tuple[str, int], int] = {}
    formats: dict[str, int] = {}
    lines = blank = 0
    with ExitStack() as stack:

        def writer(name: str) -> AtomicLines:
            return stack.enter_context(AtomicLines(out_dir / OUTPUT_FILES[name]))

        validated, sft, rejects, dpo, errors = (
            writer(name) for name in ("validated", "sft", "rejects", "dpo", "completion_errors")
        )
        problems = _ProblemLog(
            errors, listed=options.max_listed_lines, strict=options.strict, source=completions_path
        )
        digest = hashlib.sha256()
        items = read_completions(completions_path, digest)
        for item in tqdm(items, desc="validating completions", unit=" lines", disable=None):
            lines += 1
            if item is None:
                blank += 1
                continue
            if isinstance(item, LineProblem):
                problems.add(item)
                continue
            seed = seeds.get(item.id)
            if seed is None:
                problems.add(_unknown(item, invalid, Path(seeds_path).name))
                continue
            key = (item.id, item.sample)
            first = seen.get(key)
            if first is not None:
                problems.add(
                    LineProblem(
                        line=item.line,
                        kind="duplicate",
                        id=item.id,
                        sample=item.sample,
                        message=f"id {item.id!r} sample {item.sample} already read at line {first}",
                    )
                )
                continue
            seen[key] = item.line
            formats[item.format] = formats.get(item.format, 0) + 1
            _process_one(item, seed, validated, sft, rejects, collector, stats)

        for pair in collector.pairs(seeds):
            seed = seeds[pair.seed_id]
            chosen = sft.read_at(pair.chosen_offset)["messages"][-1]["content"]
            rejected = rejects.read_at(pair.rejected_offset)["output"]
            dpo.write(dpo_record(pair, seed.split, seed.prompt, chosen, rejected))
        rows = {"validated": validated.count, "sft": sft.count, "rejects": rejects.count, "dpo": dpo.count}

    parquet = {
        parquet_path(out_dir / OUTPUT_FILES[name]).name: write_parquet(out_dir / OUTPUT_FILES[name])
        for name in ("validated", "sft", "rejects", "dpo", "completion_errors")
    }

    summary: dict[str, Any] = {
        "source": {
            "file": completions_path.name,
            "sha256": digest.hexdigest(),
            "lines": lines,
            "blank_lines": blank,
            "formats": dict(sorted(formats.items())),
        },
        **stats.summary(total_seeds=len(seeds)),
        "problems": problems.kinds,
        "seed_problems": seed_problems + prompt_problems,
        "prompts_from_instruction": from_instruction,
        "exports": {
            "dpo_pairing": options.dpo_pairing,
            "seeds_with_pairs": collector.seeds_with_pairs(),
            "rows": rows,
        },
        "parquet": parquet,
        "files": {
            **OUTPUT_FILES,
            "report_markdown": "report/summary.md",
            **({name: f"report/{file}" for name, file in PLOTS.items()} if options.plots else {}),
        },
    }
    write_report(out_dir / "report", summary, plots=options.plots)
    log.info("TinyStories completions from %s\n%s", completions_path, headline_table(summary))
    bad = sum(p["count"] for p in problems.kinds.values())
    if bad:
        log.warning(
            "%d completion lines could not be used; see %s", bad, out_dir / OUTPUT_FILES["completion_errors"]
        )
    return summary


def _unknown(item: Completion, invalid: Mapping[str, str], seeds_name: str) -> LineProblem:
    reason = invalid.get(item.id)
    if reason is not None:
        return LineProblem(
            line=item.line,
            kind="bad_seed",
            id=item.id,
            sample=item.sample,
            message=f"seed {item.id!r} is invalid ({reason})",
        )
    return LineProblem(
        line=item.line,
        kind="unknown_id",
        id=item.id,
        sample=item.sample,
        message=f"no seed with id {item.id!r} in {seeds_name}",
    )


def _process_one(
    item: Completion,
    seed: SeedEntry,
    validated: AtomicLines,
    sft: AtomicLines,
    rejects: AtomicLines,
    collector: PairCollector,
    stats: ValidationStats,
) -> None:
    """Validate one completion and write it to validated.jsonl and sft or rejects."""
    output = item.output
    result = seed.checks.validate(output if item.error is None else {"error": item.error})
    validated.write(
        {
            "id": item.id,
            "sample": item.sample,
            "line": item.line,
            **result.as_record(),
            "chars": len(output) if isinstance(output, str) else None,
            "finish_reason": item.finish_reason,
            "output": output if isinstance(output, str) else None,
            "error": item.error,
        }
    )
    if result.passed:
        assert isinstance(output, str)
        offset = sft.write(sft_record(item.id, item.sample, seed.split, seed.prompt, output))
        collector.add_pass(item.id, item.sample, offset)
    else:
        offset = rejects.write(
            reject_record(item.id, item.sample, seed.split, item.line, output, item.error, result)
        )
        # Only real attempts at the task are "rejected" texts: empty, non-text and errored
        # outputs (label ``other``) teach a preference model nothing about the constraints.
        if "other" not in result.labels:
            collector.add_fail(item.id, item.sample, offset, result.labels)
    stats.add(
        seed_id=item.id,
        theme=seed.theme,
        split=seed.split or "",
        bounds=(seed.checks.min_sentences, seed.checks.max_sentences),
        result=result,
        output=output if item.error is None else None,
        finish_reason=item.finish_reason,
    )
