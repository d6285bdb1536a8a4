"""The TinyStories job's work units: one shard's render, generation and checks, and their merges.

Takes: the run's settings (plain picklable values), a shard directory, the shard's number and
the shard count. Gives: :func:`render_shard`, which writes the shard's ``prompts_seed.jsonl``,
``prompts.jsonl`` and ``rejected_seeds.jsonl`` (the seeds whose id hashes to this shard, see
:func:`~storyforge.jobs.order.shard_of`) and returns where each line belongs in the merged
files; :func:`generating` (the lock and progress of a shard's generation, whose unit is
:class:`~storyforge.jobs.tinystories_chains.GenerateUnit`); and :func:`validate_shard`, which
checks that journal's completions against the shard's seeds into the shard's own
``validated.jsonl``, ``sft.jsonl``, ``rejects.jsonl``, ``dpo.jsonl`` and
``completion_errors.jsonl``, citing the lines the records have in the run's merged
``generations.jsonl``, and returns the figures and each line's merge key (the only shard
checks the whole completion file in the run directory). Then the driver's side:
:func:`merge_seed_files`, :func:`merge_generations`, :func:`merge_shard_exports` and
:func:`combine_stats` interleave the shards' files by seed position or line (never by
completion order), and the job reduces the shards' figures to the run's
(:func:`~storyforge.tasks.tinystories.outputs.summarize_checks`); and the units the job's
stages hand an executor (:class:`RenderUnit` with :func:`run_render`, and so on).

A run in one process has one shard, ``whole``: it is the run directory itself, so there is
nothing to merge (and no lock, no ``shards/`` folder).

Why these know nothing about any executor: the same code runs in a test, on a laptop or on a
cluster node. Each shard directory is a complete journal: a retried shard (its worker died)
or a rerun after the driver died reconciles what is already there and asks only for the
rest, so every ``(id, sample)`` is written exactly once; the validation files are rewritten
whole, atomically, by each attempt. A lock file keeps two processes from ever writing in the
same shard directory at once.
"""

from __future__ import annotations

import fcntl
import heapq
import itertools
import json
import logging
import os
import threading
from array import array
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from storyforge.atomic import AtomicLines, jsonl_line, write_json_atomic, write_text_atomic
from storyforge.config.provider import GenerationSettings
from storyforge.config.settings import RunSettings
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import DataError
from storyforge.jobs.base import Report
from storyforge.jobs.order import shard_of
from storyforge.progress import progress_bar
from storyforge.providers.journal import recorded_server, server_path
from storyforge.quality.dedup import Signatures
from storyforge.runfiles import GENERATIONS, PROMPTS, SEEDS
from storyforge.runfiles import REJECTED_SEEDS as REJECTED
from storyforge.tables import DataFile
from storyforge.tasks.tinystories.completions import read_completions
from storyforge.tasks.tinystories.instruction import InstructionRenderer
from storyforge.tasks.tinystories.outputs import (
    DATA_SETS,
    EXPORTS,
    OUTPUT_FILES,
    Checked,
    ExportFiles,
    check_completions,
    check_file,
    load_inputs,
)
from storyforge.tasks.tinystories.seed_validation import Rejection, SeedValidator
from storyforge.tasks.tinystories.seeds import audit_seeds, read_seed_lines
from storyforge.tasks.tinystories.spec import SPLITS
from storyforge.tasks.tinystories.tables import data_file, parquet_path, write_parquet

__all__ = [
    "RenderUnit",
    "RenderedShard",
    "SignUnit",
    "ValidateUnit",
    "combine_stats",
    "generating",
    "merge_generations",
    "merge_seed_files",
    "merge_shard_exports",
    "quiet_generation",
    "render_shard",
    "run_render",
    "run_sign",
    "run_validate",
    "sign_shard",
    "task_settings",
    "validate_shard",
]

log = logging.getLogger(__name__)

PID_FILE = "worker.pid"
LOCK_FILE = ".lock"


@dataclass(slots=True, kw_only=True)
class RenderedShard:
    """Where each line of a shard's files goes in the merged files (positions ascend)."""

    shard: int
    template: str = ""
    """The instruction template's name (for the manifest)."""
    seeds: list[tuple[int, str]] = field(default_factory=list)
    """(position, id) per line of the shard's prompts_seed.jsonl and prompts.jsonl."""
    rejected: list[int] = field(default_factory=list)
    """position per line of the shard's rejected_seeds.jsonl."""
    splits: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})
    counts: dict[str, int] = field(default_factory=dict)
    """seeds, train, val, rejected: this shard's line counts."""
    files: dict[str, Any] | None = None
    """A whole run: each file's summary (records, bytes, sha256), by name."""
    parquet: dict[str, Any] | None = None
    """A whole run: each Parquet twin's summary, by twin name."""


def task_settings(run: RunSettings) -> TinyStoriesSettings:
    """The run's TinyStories settings (the job runs ``task=tinystories`` only)."""
    settings = run.task
    assert isinstance(settings, TinyStoriesSettings), "the TinyStories job runs task=tinystories"
    return settings


def render_shard(
    run: RunSettings, shard_dir: str, shard: int, shards: int, *, whole: bool = False
) -> RenderedShard:
    """Render this shard's seeds into ``shard_dir``; a seed's position is its index or line number.

    ``whole``: the only shard, written straight into the run directory: each file is written
    with its Parquet twin (written from the finished file, see DataFile), with a
    progress bar and each rejection logged, and no positions are kept (nothing is merged), so
    memory stays flat in ``task.n_seeds``.
    """
    settings = task_settings(run)
    out = Path(shard_dir)
    out.mkdir(parents=True, exist_ok=True)
    renderer = InstructionRenderer(settings.template, max_tokens=settings.max_tokens)
    validator = SeedValidator(settings.constraints)
    result = RenderedShard(shard=shard, template=renderer.name)
    system = [{"role": "system", "content": settings.system_message}] if settings.system_message else []
    # A whole run's files get their Parquet twins; a shard's get theirs when the shards are merged.
    with (
        data_file(out / SEEDS, twin=whole) as seeds_out,
        data_file(out / PROMPTS, twin=whole) as prompts_out,
        data_file(out / REJECTED, twin=whole) as rejected_out,
    ):
        files = _Writers(
            seeds=seeds_out,
            prompts=prompts_out,
            rejected=rejected_out,
            whole=whole,
            shard=shard,
            shards=shards,
            validator=validator,
            renderer=renderer,
            system=system,
            result=result,
        )
        if settings.seeds_path is None:
            _write_generated(settings, files)
        else:
            _write_loaded(settings.seeds_path, files)
    result.counts = {"seeds": seeds_out.count, **result.splits, "rejected": rejected_out.count}
    if whole:
        outs = (seeds_out, prompts_out, rejected_out)
        result.files = {out.path.name: out.summary() for out in outs}
        result.parquet = {out.twin_target.name: out.twin_summary() for out in outs}
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class _Writers:
    """What a shard's render writes with: its three files (``whole``: a run in one process, see
    render_shard), the checks, the prompts' system turns and the result it fills."""

    seeds: DataFile
    prompts: DataFile
    rejected: DataFile
    whole: bool
    shard: int
    shards: int
    validator: SeedValidator
    renderer: InstructionRenderer
    system: list[dict[str, str]]
    result: RenderedShard

    def reject(self, rejection: Rejection, position: int) -> None:
        self.rejected.write(rejection.as_record())
        if self.whole:
            log.warning("rejected %s", rejection)
        else:
            self.result.rejected.append(position)


def _write_loaded(seeds_path: Path, out: _Writers) -> None:
    """The seeds file's records this shard owns, checked (:func:`audit_seeds`), into the files."""
    shard, shards, result = out.shard, out.shards, out.result
    # A whole run merges nothing: its positions are not kept, so memory stays flat.
    positions: list[int] | None = None if out.whole else []

    def mine() -> Iterator[tuple[int, object]]:
        for line_no, value in read_seed_lines(seeds_path):
            rid = value.get("id") if isinstance(value, dict) else None
            owner = shard_of(rid, shards) if isinstance(rid, str) else 0
            if owner == shard:
                if positions is not None:
                    positions.append(line_no)
                yield line_no, value

    # audit_seeds yields exactly one item per line it reads, so positions line up with items.
    items = audit_seeds(mine(), out.validator, out.renderer)
    bar = progress_bar(items, desc="tinystories seeds", unit="seed", show=None if out.whole else False)
    for number, item in enumerate(bar):
        position = positions[number] if positions is not None else number
        if isinstance(item, Rejection):
            out.reject(item, position)
            continue
        out.seeds.write(item)
        out.prompts.write(
            {
                "id": item["id"],
                "split": item["split"],
                "messages": [*out.system, {"role": "user", "content": item["instruction"]}],
            }
        )
        if not out.whole:
            result.seeds.append((position, item["id"]))
        result.splits[item["split"]] += 1


_BLOCK = 1024
"""Generated seeds drawn, rendered and encoded between two hand-overs of their lines."""


def _write_generated(settings: TinyStoriesSettings, out: _Writers) -> None:
    """The generated seeds this shard owns, as the local job makes them (same rules, same
    order; a seed's position is its index), into the files.

    Every record meets the seed rules: when the generator's pools guarantee them for every
    index (:meth:`SeedGenerator.always_valid`, checked once), a record's own check is its
    instruction's (the one field not drawn from the pools); otherwise each record is checked
    whole. A record that fails is the generator breaking its own rules: a defect, not bad
    input. The lines are encoded here (:class:`_SeedLines`) and handed to the writers a block
    at a time."""
    generator = settings.seed_generator()
    n, shard, shards, result = settings.n_seeds, out.shard, out.shards, out.result
    validator, renderer = out.validator, out.renderer
    checked = not generator.always_valid(validator, n)
    shortest = int(validator.schema["properties"]["instruction"]["minLength"])
    encode = _SeedLines(out.system).encode
    draw, record_id, splits = generator.record, generator.record_id, result.splits
    kept = None if out.whole else result.seeds  # (position, id) per line, for the merge
    with progress_bar(
        total=n, desc="tinystories seeds", unit="seed", show=None if out.whole else False
    ) as bar:
        for start in range(0, n, _BLOCK):
            stop = min(start + _BLOCK, n)
            seed_lines: list[bytes] = []
            prompt_lines: list[bytes] = []
            for index in range(start, stop):
                if shards > 1 and shard_of(record_id(index), shards) != shard:
                    continue
                record = draw(index)
                try:
                    instruction = renderer(record)
                except DataError as exc:
                    out.reject(Rejection(rule="render", message=str(exc), id=record["id"]), index)
                    continue
                record["instruction"] = instruction
                if checked or not (instruction.__class__ is str and len(instruction) >= shortest):
                    rejection = validator.check(record)
                    if rejection is not None:
                        raise AssertionError(f"generated {rejection}")
                seed_line, prompt_line = encode(record)
                seed_lines.append(seed_line)
                prompt_lines.append(prompt_line)
                splits[record["split"]] += 1
                if kept is not None:
                    kept.append((index, record["id"]))
            out.seeds.write_lines(seed_lines)
            out.prompts.write_lines(prompt_lines)
            bar.update(stop - start)


class _SeedLines:
    """A checked seed record's two JSONL lines, its ``prompts_seed.jsonl`` line and its
    ``prompts.jsonl`` line (``{"id", "split", "messages"}``), byte for byte as
    :func:`~storyforge.atomic.jsonl_line` writes them, from one orjson call and a few joins.

    orjson writes the same bytes as json for exact strings, integers, lists and dicts; it is
    told to refuse subclasses (``OPT_PASSTHROUGH_SUBCLASS``), and a checked record holds no
    float (the schema allows none), so a record orjson refuses (a subclass, a lone surrogate,
    an integer past 64 bits) goes to ``jsonl_line`` whole."""

    __slots__ = ("_middles", "_system")

    def __init__(self, system: list[dict[str, str]]) -> None:
        self._system = system
        # Between the id and the instruction, per split: what every prompt line of it shares.
        messages = b"".join(jsonl_line(message)[:-1] + b"," for message in system)
        self._middles = {
            split: b',"split":'
            + orjson.dumps(split)
            + b',"messages":['
            + messages
            + b'{"role":"user","content":'
            for split in SPLITS
        }

    def encode(self, record: dict[str, Any]) -> tuple[bytes, bytes]:
        middle = self._middles.get(record["split"])
        if middle is not None:
            try:
                seed = orjson.dumps(record, option=_ORJSON_LINE)
                ident = orjson.dumps(record["id"], option=orjson.OPT_PASSTHROUGH_SUBCLASS)
                content = orjson.dumps(record["instruction"], option=orjson.OPT_PASSTHROUGH_SUBCLASS)
            except TypeError:
                pass
            else:
                return seed, b"".join((b'{"id":', ident, middle, content, b"}]}\n"))
        prompt = {
            "id": record["id"],
            "split": record["split"],
            "messages": [*self._system, {"role": "user", "content": record["instruction"]}],
        }
        return jsonl_line(record), jsonl_line(prompt)


_ORJSON_LINE = orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_SUBCLASS


def quiet_generation(generation: GenerationSettings) -> GenerationSettings:
    """The generation settings without the runner's own progress bar (a shard reports instead)."""
    return replace(generation, provider=replace(generation.provider, progress=False).seal())


@contextmanager
def generating(out: Path, report: Report | None) -> Iterator[None]:
    """Hold the shard directory's lock, and report the lines its ``generations.jsonl`` gains.

    The lock keeps a worker left over from a killed driver from ever appending to a journal a
    new run is writing (or changing it while :func:`validate_shard` reads it)."""
    with _owned(out):
        watcher = _JournalWatcher(out / GENERATIONS, report) if report is not None else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.stop()


def validate_shard(
    run: RunSettings,
    shard_dir: str,
    source: str,
    lines: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    dropped: Mapping[tuple[str, int], str] | None = None,
) -> Checked:
    """Check completions against the seeds in ``shard_dir`` into its export files.

    ``lines`` None: the only shard, the run directory itself, checks the whole completion
    file ``source`` (:func:`~storyforge.tasks.tinystories.outputs.check_file`: its repeats
    found there, each export with its Parquet twin, no positions kept). Otherwise the shard
    checks its sorted journal: ``lines`` are its lines' numbers in the merged file ``source``;
    ``positions`` the run-wide positions of the shard's seeds (one per line of its
    ``prompts_seed.jsonl``). The shard's seed files were written by :func:`render_shard` from
    checked seeds, so they are read strictly: a problem there is a defect and stops the run.
    ``dropped``: the repeats the driver found (see :func:`sign_shard`), exported as rejects.
    """
    out = Path(shard_dir)
    options = run.export
    if lines is None:
        return check_file(options, out, out / SEEDS, out / PROMPTS, Path(source), dedup=run.dedup)
    with _owned(out):
        seeds = load_inputs(
            out / SEEDS, out / PROMPTS, max_chars=options.max_chars, strict=True, positions=positions
        )
        items = read_completions(out / GENERATIONS, numbers=lines)
        with ExportFiles(out, keyed=True) as files:
            tally = check_completions(items, seeds, files, options, source=Path(source), dropped=dropped)
    return Checked(tally=tally, rows=files.rows(), keys=files.keys)


def sign_shard(run: RunSettings, shard_dir: str, lines: Sequence[int]) -> Signatures | None:
    """The MinHash signatures of the shard's usable outputs (``None`` with ``dedup=none``).

    Only these travel back to the driver, which clusters all shards' signatures at once;
    each text's ``where`` is its line in the run's merged ``generations.jsonl``.
    """
    from storyforge.tasks.tinystories.dedup_stage import scan_outputs, seed_fields

    dedup = run.dedup
    if not dedup.enabled:
        return None
    out = Path(shard_dir)
    fields = seed_fields(out / SEEDS)
    items = read_completions(out / GENERATIONS, numbers=lines)
    return scan_outputs(items, fields, fields, dedup=dedup, diversity=None).signatures


@contextmanager
def _owned(out: Path) -> Iterator[None]:
    """Hold the shard directory's lock (waiting for any other holder), with this pid on record."""
    # Atomically: whoever reads the file (a test killing this worker) sees a whole pid.
    write_text_atomic(out / PID_FILE, f"{os.getpid()}\n")
    with (out / LOCK_FILE).open("wb") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


class _JournalWatcher:
    """Counts the lines a journal gains (done, and how many are errors) and reports them.

    Reads only what was appended since the last look; a replaced file (the journal is
    rewritten when earlier records are moved aside) is read again from the start.
    """

    def __init__(self, path: Path, report: Report, *, every_s: float = 0.5) -> None:
        self._path = path
        self._report = report
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="journal-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        inode, offset, done, errors = -1, 0, 0, 0
        partial = b""
        while not self._stop.wait(self._every_s):
            try:
                st = self._path.stat()
            except FileNotFoundError:
                continue
            if st.st_ino != inode or st.st_size < offset:
                inode, offset, done, errors, partial = st.st_ino, 0, 0, 0, b""
            if st.st_size == offset:
                continue
            with self._path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read(st.st_size - offset)
            offset += len(chunk)
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for line in lines:
                done += 1
                try:
                    errors += json.loads(line).get("error") is not None
                except ValueError:
                    pass
            self._report(done, errors)


# -- merging shards, on the driver ----------------------------------------------------------------


def merge_seed_files(
    out_dir: Path, dirs: Sequence[Path], rendered: Sequence[RenderedShard]
) -> tuple[dict[str, Any], dict[str, int], dict[str, Any]]:
    """Merge the shards' seed, prompt and reject files by seed position, each with its Parquet
    twin; return their summaries, the counts and the twins' summaries (as a whole run's)."""
    seed_order = merge_order([[position for position, _ in shard.seeds] for shard in rendered])
    summaries = {
        SEEDS: merge_lines(out_dir / SEEDS, [d / SEEDS for d in dirs], seed_order),
        PROMPTS: merge_lines(out_dir / PROMPTS, [d / PROMPTS for d in dirs], seed_order),
        REJECTED: merge_lines(
            out_dir / REJECTED,
            [d / REJECTED for d in dirs],
            merge_order([shard.rejected for shard in rendered]),
        ),
    }
    splits = {split: sum(shard.splits[split] for shard in rendered) for split in ("train", "val")}
    counts = {"seeds": summaries[SEEDS]["records"], **splits, "rejected": summaries[REJECTED]["records"]}
    return (
        summaries,
        counts,
        {parquet_path(out_dir / name).name: write_parquet(out_dir / name) for name in summaries},
    )


def merge_order(keys: Sequence[Sequence[int]]) -> list[int]:
    """The source of each line in turn when lines are ordered by key (keys ascend per source;
    a tie keeps the lower source first)."""
    merged = heapq.merge(*[zip(source_keys, itertools.repeat(k)) for k, source_keys in enumerate(keys)])
    return [k for _, k in merged]


def merge_lines(target: Path, sources: Sequence[Path], order: Sequence[int]) -> dict[str, Any]:
    """Write the lines of ``sources`` into ``target``, taking the next line of source ``k`` for each ``k`` in ``order``."""
    handles = [source.open("rb") for source in sources]
    try:
        with AtomicLines(target) as out:
            for k in order:
                out.write_line(handles[k].readline())
    finally:
        for handle in handles:
            handle.close()
    return out.summary()


def merge_generations(
    target: Path, sources: Sequence[Path], positions: dict[str, int]
) -> tuple[str, list[array[int]]]:
    """Merge sorted shard journals into ``target`` by (seed position, sample, attempt).

    Journals of answers (``generations*.jsonl``, ``judgements*.jsonl``) have one line per
    (id, sample); ``attempts.jsonl`` has one per (id, sample, attempt).

    Returns the merged file's sha256 and, per source, the line number each of its lines got.
    """
    unknown = len(positions)
    lines: list[array[int]] = [array("q") for _ in sources]

    def keyed(k: int, path: Path) -> Iterator[tuple[tuple[int, int, int], int, bytes]]:
        with path.open("rb") as fh:
            for line in fh:
                record = json.loads(line)
                key = (positions.get(record["id"], unknown), record["sample"], record.get("attempt", 0))
                yield key, k, line

    merged = heapq.merge(*[keyed(k, path) for k, path in enumerate(sources)], key=lambda item: item[0])
    with AtomicLines(target) as out:
        for number, (_, k, line) in enumerate(merged, start=1):
            out.write_line(line)
            lines[k].append(number)
    # The server the answers came from (the shards of a run ask the same servers), as a
    # journal written in one process keeps it.
    servers = [found for found in map(recorded_server, sources) if found is not None]
    if servers:
        write_json_atomic(server_path(target), servers[0])
    return out.sha256, lines


def merge_shard_exports(
    out_dir: Path, dirs: Sequence[str | Path], checked: Sequence[Checked]
) -> tuple[dict[str, int], dict[str, Any]]:
    """Interleave the shards' export files into ``out_dir`` by key, each with its Parquet twin.

    Returns the rows of each data set and the twins' summaries (by twin file name).
    """
    rows: dict[str, int] = {}
    parquet: dict[str, Any] = {}
    for name in EXPORTS:
        target = out_dir / OUTPUT_FILES[name]
        sources = [Path(d) / OUTPUT_FILES[name] for d in dirs]
        order = merge_order([_keys(shard)[name] for shard in checked])
        written = merge_lines(target, sources, order)["records"]
        if name in DATA_SETS:
            rows[name] = written
        parquet[parquet_path(target).name] = write_parquet(target)
    return rows, parquet


def _keys(shard: Checked) -> dict[str, array[int]]:
    assert shard.keys is not None, "a shard's check keeps its lines' merge keys"
    return shard.keys


ADDITIVE = frozenset(
    {
        "prompts",
        "skipped_prompts",
        "total",
        "resumed",
        "requests",
        "retries",
        "errors",
        "errors_in_file",
        "tokens",
        "cache_hits",
        "timeouts",
        "cache",
    }
)
"""Generation stats that add up over shards; every other key is the same in each shard."""


def combine_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One stats mapping from the shards': the :data:`ADDITIVE` counts add up, the rest is the first's."""
    combined: dict[str, Any] = {}
    for key, value in parts[0].items():
        if key in ADDITIVE:
            combined[key] = _add([part[key] for part in parts])
        else:
            combined[key] = value
    return combined


def _add(values: Sequence[Any]) -> Any:
    """Counts add up (also inside mappings); anything else (a path, an identity) is the first's."""
    if all(isinstance(v, dict) for v in values):
        return {key: _add([v.get(key) for v in values]) for key in values[0]}
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sum(values)
    return values[0]


# -- the units a job's stages hand to an executor ---------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderUnit:
    """Render shard ``shard`` of ``shards`` into ``dir`` (``whole``: the run directory itself)."""

    settings: RunSettings
    dir: Path
    shard: int
    shards: int
    whole: bool


def run_render(unit: RenderUnit, report: Report | None) -> RenderedShard:
    """Do one :class:`RenderUnit`."""
    return render_shard(unit.settings, str(unit.dir), unit.shard, unit.shards, whole=unit.whole)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidateUnit:
    """Check the completions of ``source`` against the seeds in ``dir``: the whole file
    (``lines`` None, ``dir`` the run directory), or a shard's journal (see :func:`validate_shard`)."""

    settings: RunSettings
    dir: Path
    source: Path
    lines: array[int] | None = None
    positions: list[int] | None = None
    dropped: Mapping[tuple[str, int], str] | None = None


def run_validate(unit: ValidateUnit, report: Report | None) -> Checked:
    """Do one :class:`ValidateUnit`."""
    return validate_shard(
        unit.settings, str(unit.dir), str(unit.source), unit.lines, unit.positions, unit.dropped
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SignUnit:
    """Sign the usable outputs of the shard's journal in ``dir`` (``lines``: as in ``source``)."""

    settings: RunSettings
    dir: Path
    lines: array[int]


def run_sign(unit: SignUnit, report: Report | None) -> Signatures | None:
    """Do one :class:`SignUnit`."""
    return sign_shard(unit.settings, str(unit.dir), unit.lines)
