"""One shard's work, as plain functions a Ray worker (or any process) can run.

Takes: the run's settings (plain picklable values), a shard directory, the shard's number and
the shard count. Gives: :func:`render_shard`, which writes the shard's ``prompts_seed.jsonl``,
``prompts.jsonl`` and ``rejected_seeds.jsonl`` (the seeds whose id hashes to this shard, see
:func:`~storyforge.executors.order.shard_of`) and returns where each line belongs in the
merged files; :func:`generate_shard`, which generates the shard's prompts into its own
``generations.jsonl`` journal, sorts it, and returns the generation stats;
:func:`sign_shard`, which returns the MinHash signatures of that journal's outputs for
the driver's duplicate search; and :func:`validate_shard`, which checks that journal's completions against the shard's seeds
into the shard's own ``validated.jsonl``, ``sft.jsonl``, ``rejects.jsonl``, ``dpo.jsonl``
and ``completion_errors.jsonl`` (with their Parquet twins), citing the lines the records have
in the run's merged ``generations.jsonl``, and returns the figures and each line's merge key.

Why separate from the driver: these functions know nothing about Ray, so the same code runs
in a test, on a laptop or on a cluster node. Each shard directory is a complete journal: a
retried shard (its worker died) or a rerun after the driver died reconciles what is already
there and asks only for the rest, so every ``(id, sample)`` is written exactly once; the
validation files are rewritten whole, atomically, by each attempt. A lock file keeps two
processes from ever writing in the same shard directory at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from storyforge.atomic import AtomicLines, write_text_atomic
from storyforge.config.settings import RunSettings
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import DataError
from storyforge.executors.order import shard_of, sort_generations
from storyforge.quality.dedup import Signatures
from storyforge.tasks.tinystories.completions import read_completions
from storyforge.tasks.tinystories.instruction import InstructionRenderer
from storyforge.tasks.tinystories.outputs import (
    ExportFiles,
    Tally,
    check_completions,
    load_inputs,
    write_twins,
)
from storyforge.tasks.tinystories.seed_validation import Rejection, SeedValidator
from storyforge.tasks.tinystories.seeds import SeedGenerator, audit_seeds, read_seed_lines

__all__ = [
    "CheckedShard",
    "RenderedShard",
    "generate_shard",
    "render_shard",
    "sign_shard",
    "validate_shard",
]

SEEDS = "prompts_seed.jsonl"
PROMPTS = "prompts.jsonl"
REJECTED = "rejected_seeds.jsonl"
GENERATIONS = "generations.jsonl"
PID_FILE = "worker.pid"
LOCK_FILE = ".lock"

Report = Callable[[int, int], None]
"""``report(done, errors)``: how many of a shard's requests are in its journal, and how many failed."""


@dataclass(slots=True, kw_only=True)
class RenderedShard:
    """Where each line of a shard's files goes in the merged files (positions ascend)."""

    shard: int
    seeds: list[tuple[int, str]] = field(default_factory=list)
    """(position, id) per line of the shard's prompts_seed.jsonl and prompts.jsonl."""
    rejected: list[int] = field(default_factory=list)
    """position per line of the shard's rejected_seeds.jsonl."""
    splits: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})


def _task(run: RunSettings) -> TinyStoriesSettings:
    settings = run.task
    assert isinstance(settings, TinyStoriesSettings), "shards run task=tinystories"
    return settings


def render_shard(run: RunSettings, shard_dir: str, shard: int, shards: int) -> RenderedShard:
    """Render this shard's seeds into ``shard_dir``; a seed's position is its index or line number."""
    settings = _task(run)
    out = Path(shard_dir)
    out.mkdir(parents=True, exist_ok=True)
    renderer = InstructionRenderer(settings.template, max_tokens=settings.max_tokens)
    validator = SeedValidator(settings.constraints)
    positions: list[int] = []

    if settings.seeds_path is not None:
        seeds_path: Path = settings.seeds_path

        def mine() -> Iterator[tuple[int, object]]:
            for line_no, value in read_seed_lines(seeds_path):
                rid = value.get("id") if isinstance(value, dict) else None
                owner = shard_of(rid, shards) if isinstance(rid, str) else 0
                if owner == shard:
                    positions.append(line_no)
                    yield line_no, value

        # audit_seeds yields exactly one item per line it reads, so positions line up with items.
        items: Iterator[dict[str, Any] | Rejection] = audit_seeds(mine(), validator, renderer)
    else:
        items = _generate(settings, validator, renderer, shard, shards, positions)

    result = RenderedShard(shard=shard)
    system = [{"role": "system", "content": settings.system_message}] if settings.system_message else []
    with (
        AtomicLines(out / SEEDS) as seeds_out,
        AtomicLines(out / PROMPTS) as prompts_out,
        AtomicLines(out / REJECTED) as rejected_out,
    ):
        for number, item in enumerate(items):
            position = positions[number]
            if isinstance(item, Rejection):
                rejected_out.write(item.as_record())
                result.rejected.append(position)
                continue
            seeds_out.write(item)
            prompts_out.write(
                {
                    "id": item["id"],
                    "split": item["split"],
                    "messages": [*system, {"role": "user", "content": item["instruction"]}],
                }
            )
            result.seeds.append((position, item["id"]))
            result.splits[item["split"]] += 1
    return result


def _generate(
    settings: TinyStoriesSettings,
    validator: SeedValidator,
    renderer: InstructionRenderer,
    shard: int,
    shards: int,
    positions: list[int],
) -> Iterator[dict[str, Any] | Rejection]:
    """The generated seeds this shard owns, as the local job makes them (same rules, same order)."""
    generator = SeedGenerator(
        seed=settings.seed,
        themes=settings.themes,
        constraints=settings.constraints,
        protagonists=settings.pools.protagonists,
        objects=settings.pools.objects,
        banned=settings.pools.banned,
        id_prefix=settings.id_prefix,
        val_fraction=settings.val_fraction,
    )
    for index in range(settings.n_seeds):
        if shard_of(generator.record_id(index), shards) != shard:
            continue
        positions.append(index)
        record = generator.record(index)
        try:
            record["instruction"] = renderer(record)
        except DataError as exc:
            yield Rejection(rule="render", message=str(exc), id=record["id"])
            continue
        rejection = validator.check(record)
        if rejection is not None:  # the generator broke its own rules: a defect, not bad input
            raise AssertionError(f"generated {rejection}")
        yield record


def generate_shard(run: RunSettings, shard_dir: str, report: Report | None = None) -> dict[str, Any]:
    """Generate the shard's prompts into its journal (resuming it), sort it, return the stats.

    Holds an exclusive lock on the shard directory for the whole time, so a worker left over
    from a killed driver can never append to the journal a new run is writing (nor change it
    while :func:`validate_shard` reads it).
    """
    from storyforge.providers.runner import generate_for_job

    out = Path(shard_dir)
    generation = run.generation
    quiet = replace(generation, provider=replace(generation.provider, progress=False).seal())
    with _owned(out):
        watcher = _JournalWatcher(out / GENERATIONS, report) if report is not None else None
        try:
            path, stats = generate_for_job(quiet, out, out / PROMPTS)
        finally:
            if watcher is not None:
                watcher.stop()
        sort_generations(path, out / PROMPTS)
        if report is not None:
            report(int(stats["total"]), int(stats["errors"]))
    return stats


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedShard:
    """What :func:`validate_shard` found: the figures, and each export line's merge key."""

    tally: Tally
    keys: dict[str, array[int]]
    """Per export name: the key of each line of the shard's file, ascending (the line of the
    completion in the merged ``generations.jsonl``; the seed's position for ``dpo``)."""


def validate_shard(
    run: RunSettings,
    shard_dir: str,
    lines: Sequence[int],
    positions: Sequence[int],
    source: str,
    dropped: Mapping[tuple[str, int], str] | None = None,
) -> CheckedShard:
    """Check the shard's sorted journal into the shard's export files and their Parquet twins.

    ``lines`` are the journal's lines' numbers in the merged file ``source``; ``positions``
    the run-wide positions of the shard's seeds (one per line of its ``prompts_seed.jsonl``).
    The shard's seed files were written by :func:`render_shard` from checked seeds, so they
    are read strictly: a problem there is a defect and stops the run. ``dropped``: the
    repeats the driver found (see :func:`sign_shard`), exported as rejects.
    """
    out = Path(shard_dir)
    options = run.export
    with _owned(out):
        seeds = load_inputs(
            out / SEEDS, out / PROMPTS, max_chars=options.max_chars, strict=True, positions=positions
        )
        items = read_completions(out / GENERATIONS, numbers=lines)
        with ExportFiles(out, keyed=True) as files:
            tally = check_completions(items, seeds, files, options, source=Path(source), dropped=dropped)
        write_twins(out)
    assert files.keys is not None
    return CheckedShard(tally=tally, keys=files.keys)


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
