"""The completion stage: seeds + prompts + a completion file -> validated data sets and a report.

Takes: the export options (:class:`~storyforge.tasks.tinystories.exports.ExportOptions`: the ``export``
group, the length cap and ``strict``), the run directory, and the paths of
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

The stage is two functions, so that ``executor=ray`` can run the first on its shards:
:func:`check_completions` is the per-record work (each line parsed, checked against its seed
and written to validated/sft/rejects or completion_errors, DPO pairs chosen per seed) and
returns a :class:`Tally` of the figures (:func:`check_file` does it over a whole file);
:func:`summarize_checks` reduces the tallies of one file's passes (one, or the shards',
:func:`combine_tallies`) to the summary and the report. :func:`process_completions` is both
in one process.

Why one streaming pass: completion files can hold millions of outputs, so each line is
validated and written as it is read; only offsets of DPO candidates and small per-seed counts
stay in memory. Every file is written to a temp file and replaced at the end, so an
interrupted or failed run leaves the previous outputs untouched, and a rerun rewrites them
whole (no duplicates, no gaps). With ``strict=true`` the first bad line or seed stops the run
with a :class:`DataError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from storyforge import jsontext
from storyforge.errors import DataError
from storyforge.progress import progress_bar
from storyforge.quality.dedup import DedupConf
from storyforge.runfiles import COMPLETION_ERRORS, DPO, DUPLICATES, REJECTS, SFT, SUMMARY, VALIDATED
from storyforge.tasks.tinystories.attempts import AttemptStats
from storyforge.tasks.tinystories.completions import (
    Completion,
    LineProblem,
    read_completions,
)
from storyforge.tasks.tinystories.dedup_stage import run_quality
from storyforge.tasks.tinystories.exports import (
    AttemptPairs,
    ExportOptions,
    JudgeMarginPairs,
    Message,
    PairCollector,
    chat_messages,
    dpo_record,
    pair_collector,
    reject_record,
    sft_record,
)
from storyforge.tasks.tinystories.provenance import RunProvenance
from storyforge.tasks.tinystories.provenance import pair as pair_provenance
from storyforge.tasks.tinystories.report import (
    OPENINGS_PLOT,
    PLOTS,
    ValidationStats,
    headline_table,
    write_report,
)
from storyforge.tasks.tinystories.tables import data_file, parquet_path
from storyforge.tasks.tinystories.validate import SeedChecks, ValidationResult, check_answer, prompt_texts

__all__ = [
    "DATA_SETS",
    "EXPORTS",
    "PROBLEM_KINDS",
    "Checked",
    "ExportFiles",
    "SeedEntry",
    "Seeds",
    "Tally",
    "check_completions",
    "check_file",
    "combine_tallies",
    "load_inputs",
    "load_prompts",
    "load_seeds",
    "process_completions",
    "summarize_checks",
    "write_summary",
]

log = logging.getLogger(__name__)

PROBLEM_KINDS = ("malformed", "unknown_id", "duplicate", "bad_seed")

OUTPUT_FILES = {
    "validated": VALIDATED,
    "sft": SFT,
    "rejects": REJECTS,
    "dpo": DPO,
    "completion_errors": COMPLETION_ERRORS,
    "report": SUMMARY,
}

DATA_SETS = ("validated", "sft", "rejects", "dpo")
"""The data sets whose rows the summary counts (keys of :data:`OUTPUT_FILES`)."""
EXPORTS = (*DATA_SETS, "completion_errors")
"""The stage's JSONL files (keys of :data:`OUTPUT_FILES`); each has a Parquet twin."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedEntry:
    """What the stage needs of one seed: its checks, grouping fields, prompt turns and position.

    ``position`` orders the seed's DPO rows among all the run's seeds: its line in the seeds
    file, or the run-wide position a shard's caller gives (see :func:`load_seeds`).
    """

    checks: SeedChecks
    split: str | None
    theme: str
    prompt: tuple[Message, ...]
    position: int


def load_prompts(
    path: Path | None, *, strict: bool
) -> tuple[dict[str, tuple[Message, ...]], list[dict[str, Any]]]:
    """``prompts.jsonl`` as id -> prompt turns, plus the lines that could not be used."""
    prompts: dict[str, tuple[Message, ...]] = {}
    problems: list[dict[str, Any]] = []
    if path is None or not path.exists():
        return prompts, problems
    for line, record in jsontext.read_jsonl(path):
        seed_id = record.get("id") if isinstance(record, dict) else None
        try:
            if isinstance(record, jsontext.BadLine):
                raise DataError(record.message)
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
    positions: Sequence[int] | None = None,
) -> tuple[dict[str, SeedEntry], dict[str, str], list[dict[str, Any]]]:
    """``prompts_seed.jsonl`` as id -> :class:`SeedEntry`, ids of invalid seeds -> why, problems.

    A seed is invalid when its checks cannot be built, or when it has neither a prompt in
    ``prompts`` nor an ``instruction`` to stand in for one. A seed's position is its line
    number, or ``positions[line - 1]`` when given (a shard's seed file holds some of the run's
    seeds, one a line).
    """
    if not path.is_file():
        raise DataError(f"seed file {path} does not exist")
    seeds: dict[str, SeedEntry] = {}
    invalid: dict[str, str] = {}
    problems: list[dict[str, Any]] = []
    for line, record in jsontext.read_jsonl(path):
        seed_id = record.get("id") if isinstance(record, dict) else None
        try:
            if isinstance(record, jsontext.BadLine):
                raise DataError(record.message)
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
                position=line if positions is None else positions[line - 1],
            )
        except DataError as exc:
            if strict:
                raise DataError(f"{path}:{line}: {exc}") from None
            message = f"{path.name} line {line}: {exc}"
            problems.append({"file": path.name, "line": line, "id": seed_id, "message": str(exc)})
            if isinstance(seed_id, str) and seed_id not in seeds:
                invalid.setdefault(seed_id, message)
    return seeds, invalid, problems


@dataclass(frozen=True, slots=True, kw_only=True)
class Seeds:
    """The seeds completions are checked against, with what could not be used of the seed files."""

    entries: dict[str, SeedEntry]
    invalid: dict[str, str]
    """Ids of seeds that could not be used -> why (their completions are ``bad_seed`` lines)."""
    problems: list[dict[str, Any]]
    """Unusable lines of the seed and prompt files, for the summary's ``seed_problems``."""
    from_instruction: int
    """Seeds without a prompt in prompts.jsonl, sent as their ``instruction``."""
    file: str
    """The seed file's name, for ``unknown_id`` messages."""


def load_inputs(
    seeds_path: Path,
    prompts_path: Path | None,
    *,
    max_chars: int,
    strict: bool,
    positions: Sequence[int] | None = None,
) -> Seeds:
    """The seeds of ``seeds_path`` with their prompts from ``prompts_path`` (see :func:`load_seeds`)."""
    prompts, prompt_problems = load_prompts(prompts_path, strict=strict)
    entries, invalid, seed_problems = load_seeds(
        seeds_path, prompts, max_chars=max_chars, strict=strict, positions=positions
    )
    from_instruction = sum(1 for seed_id in entries if seed_id not in prompts)
    if from_instruction:
        log.warning(
            "%d of %d seeds have no prompt in %s; their SFT/DPO prompt is the seed's instruction",
            from_instruction,
            len(entries),
            prompts_path,
        )
    return Seeds(
        entries=entries,
        invalid=invalid,
        problems=seed_problems + prompt_problems,
        from_instruction=from_instruction,
        file=seeds_path.name,
    )


class ExportFiles:
    """The stage's JSONL files in one directory, written to temp files and replaced together.

    A clean exit of the ``with`` block commits every file; an exception leaves every target
    as it was. With ``keyed``, :attr:`keys` holds each file's merge key per line (the line of
    the completion it came from; the seed's position for ``dpo``), which is how the driver of
    a sharded run interleaves the shards' files (a shard's files get no Parquet twin: the
    merged files get theirs).
    """

    def __init__(self, out_dir: Path, *, keyed: bool = False) -> None:
        with ExitStack() as stack:
            self.writers = {
                name: stack.enter_context(data_file(out_dir / OUTPUT_FILES[name], twin=not keyed))
                for name in EXPORTS
            }
            self._stack = stack.pop_all()
        self.keys: dict[str, array[int]] | None = {name: array("q") for name in EXPORTS} if keyed else None

    def write(self, name: str, record: Any, key: int) -> int:
        """Append ``record`` to file ``name``; returns its offset there."""
        if self.keys is not None:
            self.keys[name].append(key)
        return self.writers[name].write(record)

    def pair_rows(self, chosen: int, rejected: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The sft row at offset ``chosen`` and the rejects row at ``rejected``."""
        return self.writers["sft"].read_at(chosen), self.writers["rejects"].read_at(rejected)

    def twins(self) -> dict[str, Any]:
        """The Parquet twins' summaries by twin file name (once the block has ended)."""
        return {
            parquet_path(self.writers[name].path).name: self.writers[name].twin_summary() for name in EXPORTS
        }

    def rows(self) -> dict[str, int]:
        """Rows of the data sets, for the summary's ``exports.rows``."""
        return {name: self.writers[name].count for name in DATA_SETS}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.__exit__(exc_type, exc, tb)


def _no_problems() -> dict[str, dict[str, Any]]:
    return {kind: {"count": 0, "lines": [], "more": 0} for kind in PROBLEM_KINDS}


class _ProblemLog:
    """Counts problem lines per kind, lists the first few, streams all to completion_errors.jsonl."""

    def __init__(self, files: ExportFiles, *, listed: int, strict: bool, source: Path) -> None:
        self._files = files
        self._listed = listed
        self._strict = strict
        self._source = source
        self.kinds = _no_problems()

    def add(self, problem: LineProblem) -> None:
        if self._strict:
            raise DataError(f"{self._source}:{problem.line}: {problem.kind}: {problem.message}")
        entry = self.kinds[problem.kind]
        entry["count"] += 1
        if len(entry["lines"]) < self._listed:
            entry["lines"].append(problem.line)
        else:
            entry["more"] += 1
        self._files.write("completion_errors", problem.as_record(), key=problem.line)


@dataclass(slots=True, kw_only=True)
class Tally:
    """The figures one pass over completion lines gathers, before they become the summary.

    A sharded run has one per shard; :func:`combine_tallies` adds them up to the run's.
    """

    seeds: int
    from_instruction: int
    seed_problems: list[dict[str, Any]]
    lines: int
    blank: int
    formats: dict[str, int]
    problems: dict[str, dict[str, Any]]
    """Per problem kind: ``count``, the first ``lines`` (up to ``export.max_listed_lines``), ``more``."""
    stats: ValidationStats
    seeds_with_pairs: int
    # Regeneration: the attempts' figures (None when the file has no chains).
    attempts: AttemptStats | None = None


def combine_tallies(parts: Sequence[Tally], *, listed: int) -> Tally:
    """The tally of all ``parts`` (disjoint sets of seeds and lines) as one pass would count it."""
    problems = _no_problems()
    for kind, entry in problems.items():
        entry["count"] = sum(part.problems[kind]["count"] for part in parts)
        # Each part lists its own first lines, so the run's first ones are among them.
        entry["lines"] = sorted(itertools.chain(*(part.problems[kind]["lines"] for part in parts)))[:listed]
        entry["more"] = entry["count"] - len(entry["lines"])
    stats = ValidationStats()
    formats: dict[str, int] = {}
    attempts: AttemptStats | None = None
    for part in parts:
        stats.update(part.stats)
        if part.attempts is not None:
            attempts = attempts or AttemptStats()
            attempts.update(part.attempts)
        for name, n in part.formats.items():
            formats[name] = formats.get(name, 0) + n
    return Tally(
        seeds=sum(part.seeds for part in parts),
        from_instruction=sum(part.from_instruction for part in parts),
        seed_problems=[problem for part in parts for problem in part.seed_problems],
        lines=sum(part.lines for part in parts),
        blank=sum(part.blank for part in parts),
        formats=formats,
        problems=problems,
        stats=stats,
        seeds_with_pairs=sum(part.seeds_with_pairs for part in parts),
        attempts=attempts,
    )


def process_completions(
    options: ExportOptions,
    out_dir: Path,
    seeds_path: Path,
    prompts_path: Path | None,
    completions_path: Path,
    *,
    dedup: DedupConf | None = None,
    cost: Callable[[int], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Validate every completion against its seed and write the data sets and the report.

    ``dedup``: the ``dedup`` group of a run, the repeat search and how much the diversity
    figures read (``None``: no repeat search, the figures' defaults).
    ``cost``, when given, turns the number of passing samples into the report's ``cost``
    section (the run's spending, see :mod:`storyforge.providers.cost`).

    Returns the summary (also written to ``report/summary.json``). Raises
    :class:`DataError` for a missing input file, and in ``strict`` mode for the first bad
    seed or completion line; :class:`ConfigError` for a bad ``export`` option.
    """
    checked = check_file(options, out_dir, seeds_path, prompts_path, completions_path, dedup=dedup)
    assert checked.sha256 is not None and checked.parquet is not None
    return summarize_checks(
        options,
        Path(out_dir),
        [checked.tally],
        source=Path(completions_path),
        sha256=checked.sha256,
        rows=checked.rows,
        parquet=checked.parquet,
        quality=checked.quality,
        cost=cost,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    """What one pass over completion lines wrote and counted: a whole file
    (:func:`check_file`), or a shard's journal whose files the driver merges (``keys``)."""

    tally: Tally
    rows: dict[str, int]
    """Rows of the data sets written."""
    keys: dict[str, array[int]] | None = None
    """A shard's: per export name, each line's merge key (see :class:`ExportFiles`)."""
    parquet: dict[str, Any] | None = None
    """A whole file's: the Parquet twins' summaries."""
    sha256: str | None = None
    """A whole file's: the completion file's digest."""
    quality: dict[str, Any] | None = None
    """A whole file's: the ``dedup`` and ``diversity`` sections."""


def check_file(
    options: ExportOptions,
    out_dir: Path,
    seeds_path: Path,
    prompts_path: Path | None,
    completions_path: Path,
    *,
    dedup: DedupConf | None = None,
) -> Checked:
    """The per-record half of :func:`process_completions` over a whole completion file: the
    repeats found, every line checked into the data sets (each with its Parquet twin)."""
    out_dir, seeds_path, completions_path = Path(out_dir), Path(seeds_path), Path(completions_path)
    if not completions_path.is_file():
        raise DataError(f"completions file {completions_path} does not exist (config key: completions)")
    if not seeds_path.is_file():
        raise DataError(f"seed file {seeds_path} does not exist")
    seeds = load_inputs(
        seeds_path,
        Path(prompts_path) if prompts_path else None,
        max_chars=options.max_chars,
        strict=options.strict,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    quality = run_quality(  # dedup + diversity (storyforge.tasks.tinystories.dedup_stage)
        out_dir,
        seeds_path,
        completions_path,
        seeds.entries,
        dedup=dedup or DedupConf(enabled=False),
    )
    digest = hashlib.sha256()
    items = read_completions(completions_path, digest)
    with ExportFiles(out_dir) as files:
        tally = check_completions(
            progress_bar(items, desc="validating completions", unit=" lines"),
            seeds,
            files,
            options,
            source=completions_path,
            dropped=quality.dropped,
        )
    return Checked(
        tally=tally,
        rows=files.rows(),
        parquet=files.twins(),
        sha256=digest.hexdigest(),
        quality=quality.summary,
    )


def summarize_checks(
    options: ExportOptions,
    out_dir: Path,
    parts: Sequence[Tally],
    *,
    source: Path,
    sha256: str,
    rows: dict[str, int],
    parquet: dict[str, Any],
    quality: Mapping[str, Any] | None = None,
    cost: Callable[[int], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The reduction over the passes of one completion file (one, or one per shard): the
    whole file's "no usable completion" check, then :func:`write_summary` of their tallies."""
    tally = parts[0] if len(parts) == 1 else combine_tallies(parts, listed=options.conf.max_listed_lines)
    if tally.stats.validated == 0:  # an input that yields nothing: an error under strict=true
        message = (
            f"completions: {source} holds no usable completion "
            f"({tally.lines} line(s), {tally.blank} blank; see completion_errors.jsonl)"
        )
        if options.strict:
            raise DataError(f"{message}; strict=true")
        log.warning(message)
    return write_summary(
        out_dir,
        options,
        tally,
        source=source,
        sha256=sha256,
        rows=rows,
        parquet=parquet,
        quality=quality,
        cost=cost,
    )


def check_completions(
    items: Iterable[Completion | LineProblem | None],
    seeds: Seeds,
    files: ExportFiles,
    options: ExportOptions,
    *,
    source: Path,
    dropped: Mapping[tuple[str, int], str] | None = None,
) -> Tally:
    """The per-record work: check each completion line against its seed and write it where it
    belongs, then write the DPO pairs; returns the figures.

    ``items`` are :func:`read_completions` values; ``source`` is the file their line numbers
    refer to, for ``strict`` errors. ``dropped``: (seed id, sample) -> duplicate cluster of
    the outputs that repeat another (they go to rejects.jsonl and are never paired).
    """
    problems = _ProblemLog(files, listed=options.conf.max_listed_lines, strict=options.strict, source=source)
    provenance = options.provenance.with_journal(source.name)
    stats = ValidationStats()
    chains = AttemptStats()  # the figures of regeneration chains (attempts.jsonl)
    pairing = pair_collector(options.conf.dpo_pairing.value)
    seen: dict[tuple[str, int, int], int] = {}
    formats: dict[str, int] = {}
    lines = blank = 0
    for item in items:
        lines += 1
        if item is None:
            blank += 1
            continue
        if isinstance(item, LineProblem):
            problems.add(item)
            continue
        seed = seeds.entries.get(item.id)
        if seed is None:
            problems.add(_unknown(item, seeds.invalid, seeds.file))
            continue
        key = (item.id, item.sample, item.attempt or 0)
        first = seen.get(key)
        if first is not None:
            problems.add(
                LineProblem(
                    line=item.line,
                    kind="duplicate",
                    id=item.id,
                    sample=item.sample,
                    message=f"id {item.id!r} sample {item.sample}{_attempt_text(item)} already read at line {first}",
                )
            )
            continue
        seen[key] = item.line
        formats[item.format] = formats.get(item.format, 0) + 1
        # dedup decides by (seed, sample): a chain's repeat is its last attempt's business
        cluster = (dropped or {}).get((item.id, item.sample)) if item.final else None
        _process_one(item, seed, files, pairing, stats, chains, provenance, options, cluster)

    for pair in pairing.pairs(seeds.entries):
        seed = seeds.entries[pair.seed_id]
        chosen, rejected = files.pair_rows(pair.chosen_offset, pair.rejected_offset)
        ends = (chosen.get("finish_reason"), rejected.get("finish_reason"))
        record = dpo_record(pair, seed.split, seed.prompt, _story(chosen), rejected["output"], ends)
        files.write("dpo", record | {"provenance": pair_provenance(chosen, rejected)}, key=seed.position)
    return Tally(
        seeds=len(seeds.entries),
        from_instruction=seeds.from_instruction,
        seed_problems=seeds.problems,
        lines=lines,
        blank=blank,
        formats=formats,
        problems=problems.kinds,
        stats=stats,
        seeds_with_pairs=pairing.seeds_with_pairs(),
        attempts=chains if chains.chains else None,
    )


def write_summary(
    out_dir: Path,
    options: ExportOptions,
    tally: Tally,
    *,
    source: Path,
    sha256: str,
    rows: dict[str, int],
    parquet: dict[str, Any],
    quality: Mapping[str, Any] | None = None,
    cost: Callable[[int], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The summary of a finished pass (``source``: the completion file, ``sha256``: its digest;
    ``rows``: the data sets' rows; ``parquet``: the twins' summaries; ``quality``: the
    ``dedup`` and ``diversity`` sections); writes ``report/``."""
    summary: dict[str, Any] = {
        "source": {
            "file": source.name,
            "sha256": sha256,
            "lines": tally.lines,
            "blank_lines": tally.blank,
            "formats": dict(sorted(tally.formats.items())),
        },
        **tally.stats.summary(total_seeds=tally.seeds),
        "problems": tally.problems,
        "seed_problems": tally.seed_problems,
        "prompts_from_instruction": tally.from_instruction,
        "exports": {
            "dpo_pairing": options.conf.dpo_pairing.value,
            "seeds_with_pairs": tally.seeds_with_pairs,
            "rows": rows,
        },
        **({"regeneration": tally.attempts.summary()} if tally.attempts is not None else {}),
        **({"cost": cost(tally.stats.passed)} if cost is not None else {}),
        "parquet": parquet,
        **(quality or {}),
        "files": {
            **OUTPUT_FILES,
            **({"duplicates": DUPLICATES} if (quality or {}).get("dedup", {}).get("enabled") else {}),
            "report_markdown": "report/summary.md",
            **({name: f"report/{file}" for name, file in PLOTS.items()} if options.conf.plots else {}),
            **({"openings": f"report/{OPENINGS_PLOT}"} if options.conf.plots and quality else {}),
        },
    }
    write_report(out_dir / "report", summary, plots=options.conf.plots)
    log.info("TinyStories completions from %s\n%s", source, headline_table(summary))
    bad = sum(p["count"] for p in tally.problems.values())
    if bad:
        log.warning(
            "%d completion lines could not be used; see %s", bad, out_dir / OUTPUT_FILES["completion_errors"]
        )
    return summary


def _unknown(item: Completion, invalid: Mapping[str, str], seeds_name: str) -> LineProblem:
    reason = invalid.get(item.id)
    kind, message = (
        ("unknown_id", f"no seed with id {item.id!r} in {seeds_name}")
        if reason is None
        else ("bad_seed", f"seed {item.id!r} is invalid ({reason})")
    )
    return LineProblem(line=item.line, kind=kind, id=item.id, sample=item.sample, message=message)


def _judged(result: ValidationResult, judge: Mapping[str, Any] | None) -> ValidationResult:
    """A rule-passing verdict turned into a fail by the judge: label ``other`` with the judge's
    rule and reason (the specification's labels stay the only labels); a judge error fails the
    answer too, as unverified (never guessed)."""
    if not result.passed or judge is None:
        return result
    if judge.get("error") is not None:
        reason = f"judge error: {judge['error']}"
    elif judge.get("verdict") == "fail":
        reason = f"judge: {judge.get('rule', '')}: {judge.get('reason', '')}"
    else:
        return result
    return ValidationResult(
        passed=False, labels=("other",), sentence_count=result.sentence_count, reasons=(reason,)
    )


def _score(judge: Mapping[str, Any] | None) -> float | None:
    """The verdict's numeric ``score``, when there is a verdict and its schema has one."""
    score = judge.get("score") if judge is not None else None
    return float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None


def _story(sft_row: Mapping[str, Any]) -> Any:
    """The story of an sft.jsonl row (its assistant turn)."""
    return sft_row["messages"][-1]["content"]


def _attempt_text(item: Completion) -> str:
    return f" attempt {item.attempt}" if item.attempt is not None else ""


def _chain_fields(item: Completion) -> dict[str, Any]:
    """The columns an attempt of a regeneration chain adds to its rows (none otherwise)."""
    if item.attempt is None:
        return {}
    return {"attempt": item.attempt, "chain": f"{item.id}#{item.sample}", "request_hash": item.request_hash}


def _process_one(
    item: Completion,
    seed: SeedEntry,
    files: ExportFiles,
    pairing: PairCollector | AttemptPairs | JudgeMarginPairs,
    stats: ValidationStats,
    chains: AttemptStats,
    provenance: RunProvenance,
    options: ExportOptions,
    cluster: str | None = None,
) -> None:
    """Validate one completion and write it to validated.jsonl and sft or rejects
    (rejects when it repeats another output: ``cluster`` is then its duplicate cluster)."""
    output = item.output
    checked = check_answer(
        seed.checks,
        output if item.error is None else {"error": item.error},
        finish_reason=item.finish_reason,
        prompts=prompt_texts(seed.prompt, item.repair_turn),
        echo_words=options.echo_words,
        max_tokens=options.max_tokens,
    )
    result = _judged(checked, item.judge)
    chain = _chain_fields(item)
    origin = provenance.row(item, result.labels)
    files.write(
        "validated",
        {
            "id": item.id,
            "sample": item.sample,
            **chain,
            "line": item.line,
            **result.as_record(),
            "chars": len(output) if isinstance(output, str) else None,
            "finish_reason": item.finish_reason,
            "output": output if isinstance(output, str) else None,
            "error": item.error,
            "provenance": origin,
        },
        key=item.line,
    )
    attempt = item.attempt or 1
    if result.passed and cluster is None:
        assert isinstance(output, str)
        # The original prompt, never a repair conversation.
        record = sft_record(item.id, item.sample, seed.split, seed.prompt, output, item.finish_reason)
        if chain:
            record["attempt"] = attempt
        record["provenance"] = origin
        offset = files.write("sft", record, key=item.line)
        if item.judge is not None or not pairing.judged:
            pairing.add_pass(item.id, item.sample, offset, attempt=attempt, score=_score(item.judge))
    else:
        # dedup: a repeat (``cluster``) goes here even when it passed, and is never chosen
        record = reject_record(
            item.id,
            item.sample,
            seed.split,
            item.line,
            output,
            item.error,
            result,
            cluster,
            item.finish_reason,
        )
        if chain:
            record["attempt"] = attempt
        record["provenance"] = origin
        offset = files.write("rejects", record, key=item.line)
        judge = item.judge
        if pairing.judged:  # a final answer that passed the rules and the judge failed
            usable = item.final and judge is not None and judge.get("verdict") == "fail"
        else:
            # Only real attempts at the task are "rejected" texts: empty, non-text and errored
            # outputs (label ``other``) teach a preference model nothing about the constraints.
            usable = not result.passed and "other" not in result.labels
        if usable:
            pairing.add_fail(
                item.id, item.sample, offset, result.labels, attempt=attempt, score=_score(judge)
            )
    if item.attempt is not None:
        chains.add(
            chain=chain["chain"],
            attempt=attempt,
            passed=result.passed,
            labels=result.labels,
            final=item.final,
        )
    if item.judge is not None:
        stats.add_judge(item.judge)  # every judged attempt
    if not item.final:
        return  # the chain's figures count its last attempt; earlier ones are in "regeneration"
    stats.add(
        seed_id=item.id,
        theme=seed.theme,
        split=seed.split or "",
        bounds=(seed.checks.min_sentences, seed.checks.max_sentences),
        result=result,
        output=output if item.error is None else None,
        finish_reason=item.finish_reason,
    )
