"""The TinyStories job in shards on Ray: config -> shards on workers -> the usual run files.

Takes: the run's settings (``executor=ray``) and the run directory. Gives: the same files and
manifest as ``executor=local`` (``prompts_seed.jsonl``, ``prompts.jsonl``,
``rejected_seeds.jsonl``, ``generations.jsonl``, ``validated.jsonl``, ``sft.jsonl``,
``rejects.jsonl``, ``dpo.jsonl``, ``report/``, ``manifest.json``), plus ``shards/NNNN/`` with
each shard's own files and journal, and returns the manifest. The manifest adds ``executor``.

How: seeds are split by :func:`~storyforge.executors.order.shard_of`. Phase one renders every
shard on a worker (:func:`~storyforge.executors.shard.render_shard`); the driver merges the
seed files by seed position (its index, or its line in ``seeds_path``), so ``strict`` stops the
run before any request, as it does locally. Phase two generates every shard into its own
journal on a worker (:func:`~storyforge.executors.shard.generate_shard`); a task whose worker
dies is started again (``executor.max_retries``) and resumes its journal. The driver merges the
sorted shard journals by (seed position, sample), noting the line each record gets. Phase
three validates every shard on a worker (:func:`~storyforge.executors.shard.validate_shard`):
the per-record checks, the validated/SFT/reject/DPO rows and their Parquet twins, citing the
merged line numbers. The driver interleaves the shards' files by those lines (DPO rows by seed
position), Parquet twins included, adds up the shards' figures and writes the report: it
validates nothing itself. Every merge streams or stays columnar; nothing depends on completion
order. An external ``completions`` file (no provider) is validated on the driver.

Where: ``executor.address=local`` starts a private Ray instance (``executor.num_cpus``) and
stops it at the end; ``auto`` and ``ray://...`` join a running cluster. Every node must see
the run directory at the same path (a shared filesystem), as shards write there.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

import storyforge
from storyforge.atomic import AtomicLines, write_json_atomic
from storyforge.config.executor import ExecutorConf
from storyforge.config.settings import RunSettings
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import ConfigError, DataError, StoryforgeError
from storyforge.executors.shard import (
    GENERATIONS,
    PROMPTS,
    REJECTED,
    SEEDS,
    CheckedShard,
    RenderedShard,
    generate_shard,
    render_shard,
    sign_shard,
    validate_shard,
)
from storyforge.quality.dedup import Signatures
from storyforge.tasks.tinystories.dedup_stage import Quality, run_quality
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.instruction import InstructionRenderer
from storyforge.tasks.tinystories.outputs import (
    DATA_SETS,
    EXPORTS,
    OUTPUT_FILES,
    combine_tallies,
    process_completions,
    write_summary,
)
from storyforge.tasks.tinystories.tables import merge_parquet, parquet_path

__all__ = [
    "SHARDS_DIR",
    "Progress",
    "merge_shard_exports",
    "run_sharded",
    "start_local_ray",
    "summarize_shards",
]

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"
MANIFEST = "manifest.json"
_POLL_S = 0.5


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "executor=ray needs Ray: pip install 'storyforge[ray]' (or choose executor=local)"
        ) from None
    return ray


_START_ATTEMPTS = 3
"""Ray gives its raylet a fixed 30 s to register; on a machine busy with other work it can
miss that, and a fresh attempt usually succeeds."""


def start_local_ray(num_cpus: int | None) -> None:
    """Start a private Ray instance whose workers import this same storyforge."""
    ray = _ray()
    root = str(Path(storyforge.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": path}},
            )
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == _START_ATTEMPTS:
                raise
            log.warning("the local Ray instance did not start in time (%s); starting it again", exc)
            ray.shutdown()


def _connect(conf: ExecutorConf) -> bool:
    """Connect to Ray as ``conf.address`` says; True when this call started it (so we stop it)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    if conf.address == "local":
        start_local_ray(conf.num_cpus)
    else:
        ray.init(address=conf.address, configure_logging=False, log_to_driver=False)
    return True


class Progress:
    """A Ray actor holding each shard's latest (done, errors), read by the driver's bar."""

    def __init__(self) -> None:
        self._counts: dict[int, tuple[int, int]] = {}

    def report(self, shard: int, done: int, errors: int) -> None:
        self._counts[shard] = (done, errors)

    def totals(self) -> tuple[int, int]:
        return sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values())


@dataclass(frozen=True, slots=True)
class _Reporter:
    """The callback a shard gets: forwards its counts to the :class:`Progress` actor."""

    actor: Any
    shard: int

    def __call__(self, done: int, errors: int) -> None:
        self.actor.report.remote(self.shard, done, errors)


def run_sharded(run_settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    """Run the job in ``executor.shards`` shards on Ray and merge them into ``out_dir``."""
    settings = run_settings.task
    assert isinstance(settings, TinyStoriesSettings)
    if run_settings.provider is not None:
        from storyforge.providers.runner import build_provider

        build_provider(run_settings.provider)  # checked before Ray starts or any file is written
    conf = run_settings.executor
    started_here = _connect(conf)
    try:
        return _run(run_settings, settings, conf, Path(out_dir))
    finally:
        if started_here:
            _ray().shutdown()


def _run(
    plain: RunSettings, settings: TinyStoriesSettings, conf: ExecutorConf, out_dir: Path
) -> dict[str, Any]:
    ray = _ray()
    out_dir.mkdir(parents=True, exist_ok=True)
    dirs = [str(out_dir / SHARDS_DIR / f"{k:04d}") for k in range(conf.shards)]
    if settings.seeds_path is not None:
        log.info("loading seeds from %s (task.n_seeds is ignored)", settings.seeds_path)

    render = ray.remote(render_shard).options(max_retries=conf.max_retries)
    clock = _Clock()
    rendered: list[RenderedShard] = _get(
        ray, [render.remote(plain, d, k, conf.shards) for k, d in enumerate(dirs)]
    )
    clock.lap("render_s")
    files, counts = _merge_seed_files(out_dir, dirs, rendered)
    clock.lap("merge_s")
    if counts["rejected"] and settings.strict:
        for name in (SEEDS, PROMPTS):
            (out_dir / name).unlink(missing_ok=True)
        raise DataError(
            f"{counts['rejected']} seed record(s) rejected with strict=true; "
            f"see {out_dir / REJECTED} (prompt files were not written)"
        )
    executor = {"name": "ray", "address": conf.address, "shards": conf.shards, "timings": clock.laps}
    from storyforge.jobs.tinystories import seed_manifest

    template_name = InstructionRenderer(settings.template, max_tokens=settings.max_tokens).name
    manifest = seed_manifest(plain, template=template_name, counts=counts, files=files, out_dir=out_dir)
    manifest["executor"] = executor
    write_json_atomic(out_dir / MANIFEST, manifest)
    log.info(
        "wrote %d seeds (%d train, %d val), %d rejected, to %s (%d shards)",
        counts["seeds"],
        counts["train"],
        counts["val"],
        counts["rejected"],
        out_dir,
        conf.shards,
    )

    if plain.stage == "batch_export":
        from storyforge.jobs.tinystories import batch_export

        return batch_export(plain, out_dir, out_dir / PROMPTS, manifest)
    from storyforge.jobs.tinystories import plain as plain_data

    if plain.provider is not None:
        manifest["generation"] = _generate(ray, plain, conf, dirs, rendered)
        clock.lap("generate_s")
        summary = _validate(ray, plain, conf, out_dir, dirs, rendered, clock)
        manifest["completions"] = plain_data(summary)
    elif settings.completions is not None:
        summary = process_completions(
            plain.export,
            out_dir,
            out_dir / SEEDS,
            out_dir / PROMPTS,
            settings.completions,
            dedup=plain.dedup,
            diversity=plain.diversity,
        )
        clock.lap("validate_s")
        manifest["completions"] = plain_data(summary)
    if "generation" in manifest or "completions" in manifest:
        write_json_atomic(out_dir / MANIFEST, manifest)
    if "generation" in manifest and plain.provider is not None:
        from storyforge.providers.runner import check_error_rate

        check_error_rate(manifest["generation"], plain.provider.max_error_rate, out_dir / GENERATIONS)
    return manifest


class _Clock:
    """Seconds per phase of the driver, for the manifest's ``executor.timings`` (laps add up)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        took, self._last = now - self._last, now
        self.laps[name] = round(self.laps.get(name, 0.0) + took, 3)
        return took


def _get(ray: Any, refs: Any) -> Any:
    """``ray.get`` that re-raises a shard's storyforge error as itself (one clear line)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, StoryforgeError):
            raise cause from None
        raise


def _merge_seed_files(
    out_dir: Path, dirs: Sequence[str], rendered: Sequence[RenderedShard]
) -> tuple[dict[str, Any], dict[str, int]]:
    """Merge the shards' seed, prompt and reject files by seed position; return summaries, counts."""
    seed_order = _order([[position for position, _ in shard.seeds] for shard in rendered])
    summaries = {
        SEEDS: _merge_lines(out_dir / SEEDS, [Path(d) / SEEDS for d in dirs], seed_order),
        PROMPTS: _merge_lines(out_dir / PROMPTS, [Path(d) / PROMPTS for d in dirs], seed_order),
        REJECTED: _merge_lines(
            out_dir / REJECTED,
            [Path(d) / REJECTED for d in dirs],
            _order([shard.rejected for shard in rendered]),
        ),
    }
    train = sum(shard.splits["train"] for shard in rendered)
    val = sum(shard.splits["val"] for shard in rendered)
    counts = {
        "seeds": summaries[SEEDS]["records"],
        "train": train,
        "val": val,
        "rejected": summaries[REJECTED]["records"],
    }
    return summaries, counts


def _order(keys: Sequence[Sequence[int]]) -> list[int]:
    """The source of each line in turn when lines are ordered by key (keys ascend per source;
    a tie keeps the lower source first)."""
    merged = heapq.merge(*[zip(source_keys, itertools.repeat(k)) for k, source_keys in enumerate(keys)])
    return [k for _, k in merged]


def _merge_lines(target: Path, sources: Sequence[Path], order: Sequence[int]) -> dict[str, Any]:
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


def _merge_generations(
    target: Path, sources: Sequence[Path], positions: dict[str, int]
) -> tuple[str, list[array[int]]]:
    """Merge sorted shard journals into ``target`` by (seed position, sample).

    Returns the merged file's sha256 and, per source, the line number each of its lines got.
    """
    unknown = len(positions)
    lines: list[array[int]] = [array("q") for _ in sources]

    def keyed(k: int, path: Path) -> Iterator[tuple[tuple[int, int], int, bytes]]:
        with path.open("rb") as fh:
            for line in fh:
                record = json.loads(line)
                yield (positions.get(record["id"], unknown), record["sample"]), k, line

    merged = heapq.merge(*[keyed(k, path) for k, path in enumerate(sources)], key=lambda item: item[0])
    with AtomicLines(target) as out:
        for number, (_, k, line) in enumerate(merged, start=1):
            out.write_line(line)
            lines[k].append(number)
    return out.sha256, lines


def _validate(
    ray: Any,
    plain: RunSettings,
    conf: ExecutorConf,
    out_dir: Path,
    dirs: Sequence[str],
    rendered: Sequence[RenderedShard],
    clock: _Clock,
) -> dict[str, Any]:
    """Merge the journals, validate every shard on a worker, merge their exports; return the summary."""
    journal = out_dir / GENERATIONS
    positions = {seed_id: position for shard in rendered for position, seed_id in shard.seeds}
    sha256, lines = _merge_generations(journal, [Path(d) / GENERATIONS for d in dirs], positions)
    log.info("merged %d shard journals in %.2fs", conf.shards, clock.lap("merge_s"))

    quality = _dedup(ray, plain, conf, out_dir, dirs, lines, journal)  # storyforge.quality
    clock.lap("dedup_s")
    task = ray.remote(validate_shard).options(max_retries=conf.max_retries)
    checked: list[CheckedShard] = _get(
        ray,
        [
            task.remote(
                plain,
                d,
                lines[k],
                [position for position, _ in rendered[k].seeds],
                str(journal),
                quality.dropped,
            )
            for k, d in enumerate(dirs)
        ],
    )
    clock.lap("shard_validate_s")

    records, parquet = merge_shard_exports(out_dir, dirs, checked)
    clock.lap("merge_s")
    summary = summarize_shards(
        plain.export,
        out_dir,
        checked,
        records,
        parquet,
        source=journal,
        sha256=sha256,
        quality=quality.summary,
    )
    clock.lap("validate_s")
    return summary


def merge_shard_exports(
    out_dir: Path, dirs: Sequence[str], checked: Sequence[CheckedShard]
) -> tuple[dict[str, int], dict[str, Any]]:
    """Interleave the shards' export files, and their Parquet twins, into ``out_dir`` by key.

    Returns the records of each export and the twins' summaries (by twin file name).
    """
    records: dict[str, int] = {}
    parquet: dict[str, Any] = {}
    for name in EXPORTS:
        target = out_dir / OUTPUT_FILES[name]
        sources = [Path(d) / OUTPUT_FILES[name] for d in dirs]
        order = _order([shard.keys[name] for shard in checked])
        records[name] = _merge_lines(target, sources, order)["records"]
        parquet[parquet_path(target).name] = merge_parquet(target, sources, order)
    return records, parquet


def summarize_shards(
    options: ExportOptions,
    out_dir: Path,
    checked: Sequence[CheckedShard],
    records: Mapping[str, int],
    parquet: dict[str, Any],
    *,
    source: Path,
    sha256: str,
    quality: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's summary and report from the shards' figures (``source``: the merged journal)."""
    tally = combine_tallies([shard.tally for shard in checked], listed=options.max_listed_lines)
    rows = {name: records[name] for name in DATA_SETS}
    return write_summary(
        out_dir, options, tally, source=source, sha256=sha256, rows=rows, parquet=parquet, quality=quality
    )


def _dedup(
    ray: Any,
    plain: RunSettings,
    conf: ExecutorConf,
    out_dir: Path,
    dirs: Sequence[str],
    lines: Sequence[array[int]],
    journal: Path,
) -> Quality:
    """Signatures computed on the workers (only they travel), clustered on the driver."""
    dedup, diversity = plain.dedup, plain.diversity
    signatures = None
    if dedup.enabled:
        task = ray.remote(sign_shard).options(max_retries=conf.max_retries)
        parts = _get(ray, [task.remote(plain, d, lines[k]) for k, d in enumerate(dirs)])
        signatures = Signatures.concat(parts, dedup.num_perm)
    return run_quality(
        out_dir, out_dir / SEEDS, journal, None, dedup=dedup, diversity=diversity, signatures=signatures
    )


def _generate(
    ray: Any,
    plain: RunSettings,
    conf: ExecutorConf,
    dirs: Sequence[str],
    rendered: Sequence[RenderedShard],
) -> dict[str, Any]:
    """Generate every shard on a worker with one progress bar; return the combined stats."""
    started = time.perf_counter()
    assert plain.provider is not None
    samples = plain.provider.samples
    total = sum(len(shard.seeds) for shard in rendered) * samples
    progress = ray.remote(num_cpus=0)(Progress).remote()
    task = ray.remote(generate_shard).options(max_retries=conf.max_retries)
    refs = {task.remote(plain, d, _Reporter(progress, k)): k for k, d in enumerate(dirs)}
    results: dict[int, dict[str, Any]] = {}
    bar = tqdm(
        total=total,
        desc=f"generate {getattr(plain.provider, 'model', '')} on {conf.shards} shards",
        unit="req",
        disable=not plain.provider.progress,
        dynamic_ncols=True,
        postfix={"errors": 0},
    )
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
            for ref in ready:
                results[refs[ref]] = _get(ray, ref)
            if pending:
                done, errors = ray.get(progress.totals.remote())
            else:  # every shard has returned: its own stats are the final word
                done = sum(int(r["total"]) for r in results.values())
                errors = sum(int(r["errors"]) for r in results.values())
            bar.update(max(0, done - bar.n))
            bar.set_postfix(errors=errors, refresh=not pending)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        bar.close()
        ray.kill(progress)
    stats = _combine([results[k] for k in range(len(dirs))])
    stats["wall_time_s"] = round(time.perf_counter() - started, 3)
    return stats


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
    }
)
"""Generation stats that add up over shards; every other key is the same in each shard."""


def _combine(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One stats mapping from the shards': the :data:`ADDITIVE` counts add up, the rest is the first's."""
    combined: dict[str, Any] = {}
    for key, value in parts[0].items():
        if key in ADDITIVE:
            combined[key] = _add([part[key] for part in parts])
        else:
            combined[key] = value
    return combined


def _add(values: Sequence[Any]) -> Any:
    if isinstance(values[0], dict):
        return {key: _add([v[key] for v in values]) for key in values[0]}
    return sum(values)
