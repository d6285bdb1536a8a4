"""The TinyStories job: config -> prompt seeds -> instructions -> prompts, in the run directory.

Takes: the run's settings (:class:`~storyforge.config.settings.RunSettings`) and the Hydra run
directory. Gives (files in ``out_dir``):
``prompts_seed.jsonl`` (validated seeds), ``prompts.jsonl`` (``{"id", "split", "messages"}``,
chat format ending with the user turn that holds the instruction), ``rejected_seeds.jsonl``
(one ``{"line", "id", "rule", "message"}`` per refused input record), a Parquet twin of each
(same rows, fixed schema, so an empty file still loads) and ``manifest.json``
(counts, each file's sha256, the storyforge version and the config's hash); returns the
manifest. When a provider is configured, or ``completions`` names a file, the completions
are generated and checked afterwards and their figures are merged into the manifest.

It is a :class:`~storyforge.jobs.base.Job` of up to three stages, whose units are in
:mod:`storyforge.jobs.tinystories_shards` and :mod:`storyforge.jobs.tinystories_chains`:
``render`` (seeds -> prompt files, one unit per shard), ``generate`` (prompts ->
``generations.jsonl`` when a provider is set, one
:class:`~storyforge.jobs.tinystories_chains.GenerateUnit` per shard: priced and, with
``regenerate.max_attempts > 1`` or a judge, regenerated until valid and judged) and
``shard_validate`` (completions -> data sets and report, per shard), or ``validate`` (the same
in one unit: one shard, a run with chains, which checks the merged ``attempts.jsonl``, or a
completion file given with ``completions``; with a judge and a provider, ``judge`` first: the
provider serves the judge only, :class:`~storyforge.jobs.judge.JudgeFileUnit`). The rules
between groups are checked first (:func:`~storyforge.config.settings.check_tinystories_run`).
``executor=local`` asks for one shard, which is the run directory itself; ``executor=ray``
for ``executor.shards``, merged here by seed position and line, so both write the same bytes.

Why it is shaped this way: records stream from the generator (or the seeds file) through
validation and rendering straight into temp files, so memory stays flat in ``n_seeds``; the
files replace their targets only when complete; nothing written depends on the clock, the
environment or the run directory, so re-running the ``.hydra`` snapshot gives the same bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import storyforge
from storyforge.atomic import write_json_atomic
from storyforge.config.drift import check_drift_stage
from storyforge.config.settings import RunSettings, check_tinystories_run
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import DataError, ProviderError
from storyforge.extras import check_run
from storyforge.jobs.base import Progress, Stage
from storyforge.jobs.tinystories_chains import (
    Generated,
    GenerateUnit,
    chains_enabled,
    cost_section,
    merge_shard_chains,
    open_run_meter,
    run_generate,
    shard_meters,
)
from storyforge.jobs.tinystories_shards import (
    RenderedShard,
    RenderUnit,
    SignUnit,
    ValidateUnit,
    combine_stats,
    merge_generations,
    merge_seed_files,
    merge_shard_exports,
    run_render,
    run_sign,
    run_validate,
    task_settings,
)
from storyforge.providers.cost import CostEstimate
from storyforge.providers.error_budget import run_error_counts
from storyforge.quality.dedup import Signatures
from storyforge.runfiles import GENERATIONS, MANIFEST, PROMPTS, SEEDS, SFT
from storyforge.runfiles import REJECTED_SEEDS as REJECTED
from storyforge.tasks.tinystories.dedup_stage import run_quality
from storyforge.tasks.tinystories.outputs import Checked, summarize_checks
from storyforge.tasks.tinystories.tables import parquet_path

if TYPE_CHECKING:  # the drift gate's modules load only for stage=drift
    from storyforge.config.drift import DriftConf

__all__ = [
    "MANIFEST",
    "PROMPTS",
    "REJECTED",
    "SEEDS",
    "SHARDS_DIR",
    "TinyStoriesJob",
    "batch_export",
    "plain",
    "run",
    "seed_manifest",
]

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"


def run(run_settings: RunSettings, out_dir: Path) -> TinyStoriesJob:
    """The TinyStories job for these settings; its provider is checked before anything is written.

    ``stage=drift`` then runs the train/serve gate (:mod:`storyforge.drift`) on the run's
    ``sft.jsonl`` with the ``drift`` group's serving sides (``drift_report.json``)."""
    check_run(  # every optional library the run needs, named in one line
        provider=None if run_settings.provider is None else run_settings.provider.name,
        exports=run_settings.provider is not None
        or (isinstance(run_settings.task, TinyStoriesSettings) and run_settings.task.completions is not None),
        dedup=run_settings.dedup.enabled,
        diversity=run_settings.dedup.diversity.enabled,
        plots=run_settings.export.conf.plots,
        executor=run_settings.executor.name,
        stage=run_settings.stage,
    )
    check_drift_stage(run_settings.drift, run_settings.stage)
    drift = None
    if run_settings.stage == "drift":
        from storyforge.drift.stage import gate_options

        drift = gate_options(run_settings.drift, exports=(Path(out_dir) / SFT,))
    check_tinystories_run(run_settings, Path(out_dir) / GENERATIONS)
    if run_settings.provider is not None:
        from storyforge.providers.runner import build_provider

        # Settings (model, API key variable, limits) are checked before any file is written.
        build_provider(run_settings.provider)
        if run_settings.judge.enabled:
            from storyforge.jobs.judge import judge_provider_conf

            build_provider(judge_provider_conf(run_settings.provider, run_settings.judge))
    return TinyStoriesJob(settings=run_settings, out_dir=Path(out_dir), drift=drift)


@dataclass(slots=True, kw_only=True)
class TinyStoriesJob:
    """Seeds, prompts, and (with a provider or a completion file) the checked data sets."""

    settings: RunSettings
    out_dir: Path
    drift: DriftConf | None = None
    """``stage=drift``: the gate run on ``sft.jsonl`` once the data sets are written."""
    manifest: dict[str, Any] = field(default_factory=dict)
    _dirs: list[Path] = field(default_factory=list)
    _rendered: list[RenderedShard] = field(default_factory=list)
    _started: float = 0.0
    _chains: Generated | None = None
    """What the ``generate`` stage did, its shards merged."""
    _estimate: CostEstimate | None = None

    def stages(self, shards: int, executor: Mapping[str, Any] | None = None) -> Iterator[Stage[Any, Any]]:
        """``render``; then ``generate`` and ``shard_validate``, or ``validate`` (see the module)."""
        task = task_settings(self.settings)
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        whole = shards == 1
        self._dirs = [out] if whole else [out / SHARDS_DIR / f"{k:04d}" for k in range(shards)]
        if task.seeds_path is not None:
            log.info("loading seeds from %s (task.n_seeds is ignored)", task.seeds_path)
        yield Stage(
            name="render",
            units=[
                RenderUnit(settings=self.settings, dir=d, shard=k, shards=shards, whole=whole)
                for k, d in enumerate(self._dirs)
            ],
            run=run_render,
            merge=lambda rendered: self._merge_seeds(rendered, executor),
        )
        if self.settings.stage == "batch_export":
            return
        provider = self.settings.provider
        if task.completions is not None and provider is not None:
            # completions=FILE with a judge (checked in run()): the provider serves the judge only.
            from storyforge.jobs.judge_file import JUDGED, JudgeFileUnit, run_judge_file

            unit = JudgeFileUnit(settings=self.settings, dir=out, completions=task.completions)
            yield Stage(name="judge", units=[unit], run=run_judge_file, merge=self._merge_judge)
            yield from self._validate(out / JUDGED)
        elif provider is not None:
            # One unit per shard: priced, and regenerated / judged when asked, in the shard's
            # directory (one shard: the run directory); several are merged into the run
            # directory by seed position, sample and attempt.
            self._started = time.perf_counter()
            meter, estimate = open_run_meter(self.settings, out)
            prompts = [shard.counts["seeds"] for shard in self._rendered]
            yield Stage(
                name="generate",
                units=[
                    GenerateUnit(settings=self.settings, dir=d, meter=m, whole=whole)
                    for d, m in zip(self._dirs, shard_meters(meter, prompts), strict=True)
                ],
                run=run_generate,
                merge=lambda results: self._merge_generated(results, estimate),
                progress=None
                if whole  # the runner draws its own bar
                else Progress(
                    total=sum(prompts) * provider.samples,
                    desc=f"generate {getattr(provider, 'model', '')} on {shards} shards",
                    enabled=provider.progress,
                ),
            )
            assert self._chains is not None and self._chains.completions is not None
            sharded = not (whole or chains_enabled(self.settings))
            yield from self._validate(self._chains.completions, self._chains, sharded=sharded)
        elif task.completions is not None:
            yield from self._validate(task.completions)

    def _validate(
        self, completions: Path, chains: Generated | None = None, *, sharded: bool = False
    ) -> Iterator[Stage[Any, Any]]:
        """The completion stage: checks, repeats, data sets, report (with the cost section when
        the model is priced: ``pricing.models``; an unpriced one costs nothing).

        ``validate``: one :class:`ValidateUnit` checks the whole file in the run directory (one
        shard, a run with chains, which checks the merged ``attempts.jsonl``, or a completion
        file). ``sharded``: the shards' journals are merged into the run's, every shard's
        outputs signed (stage ``dedup``) and the repeats found on the driver; then in
        ``shard_validate`` each shard checks its own lines there. Either way the run's figures
        are the reduction of the units' (:func:`summarize_checks`)."""
        self._provenance_served()
        meter = chains.meter if chains is not None else None
        cost = cost_section(meter) if meter is not None and meter.priced else None
        out, settings = self.out_dir, self.settings
        if not sharded:

            def merge_one(checked: list[Checked]) -> None:
                one = checked[0]
                assert one.sha256 is not None and one.parquet is not None
                self._summarize(checked, completions, one.sha256, one.rows, one.parquet, one.quality, cost)

            unit = ValidateUnit(settings=settings, dir=out, source=completions)
            yield Stage(name="validate", units=[unit], run=run_validate, merge=merge_one)
            return
        started = time.perf_counter()
        sha256, lines = merge_generations(
            completions, [d / GENERATIONS for d in self._dirs], self._positions()
        )
        log.info("merged %d shard journals in %.2fs", len(self._dirs), time.perf_counter() - started)
        dedup = settings.dedup
        signed: list[Signatures | None] = []
        if dedup.enabled:
            # Signatures are computed on the workers (only they travel), clustered on the driver.
            yield Stage(
                name="dedup",
                units=[SignUnit(settings=settings, dir=d, lines=lines[k]) for k, d in enumerate(self._dirs)],
                run=run_sign,
                merge=signed.extend,
            )
        parts = [part for part in signed if part is not None]
        signatures = Signatures.concat(parts, dedup.num_perm) if dedup.enabled else None
        quality = run_quality(out, out / SEEDS, completions, None, dedup=dedup, signatures=signatures)
        units = [
            ValidateUnit(
                settings=settings,
                dir=d,
                source=completions,
                lines=lines[k],
                positions=[position for position, _ in self._rendered[k].seeds],
                dropped=quality.dropped,
            )
            for k, d in enumerate(self._dirs)
        ]

        def merge(checked: list[Checked]) -> None:
            rows, parquet = merge_shard_exports(out, self._dirs, checked)
            self._summarize(checked, completions, sha256, rows, parquet, quality.summary, cost)

        yield Stage(name="shard_validate", units=units, run=run_validate, merge=merge)

    def _summarize(
        self,
        checked: list[Checked],
        source: Path,
        sha256: str,
        rows: dict[str, int],
        parquet: dict[str, Any],
        quality: dict[str, Any] | None,
        cost: Callable[[int], dict[str, Any]] | None,
    ) -> None:
        """The run's summary and report: the reduction of the units' figures (the whole
        file's "no usable completion" check among them), into the manifest."""
        summary = summarize_checks(
            self.settings.export,
            self.out_dir,
            [part.tally for part in checked],
            source=source,
            sha256=sha256,
            rows=rows,
            parquet=parquet,
            quality=quality,
            cost=cost,
        )
        self.manifest["completions"] = plain(summary)
        chains, estimate = self._chains, self._estimate
        if chains is not None and estimate is not None and "cost" in summary:
            from storyforge.jobs.costing import estimate_record

            self.manifest["cost"] = {
                **summary["cost"],
                "this_run": chains.meter.run_summary(),
                "estimate": estimate_record(estimate),
            }

    def _merge_seeds(self, rendered: list[RenderedShard], executor: Mapping[str, Any] | None) -> None:
        self._rendered = rendered
        out, shards = self.out_dir, len(rendered)
        first = rendered[0]
        if shards == 1 and first.files is not None and first.parquet is not None:
            files, counts, parquet = first.files, first.counts, first.parquet
        else:
            files, counts, parquet = merge_seed_files(out, self._dirs, rendered)
        strict = self.settings.strict
        failure = None
        if counts["rejected"] and strict:
            failure = (
                f"{counts['rejected']} seed record(s) rejected with strict=true; "
                f"see {out / REJECTED} (prompt files were not written)"
            )
        elif not counts["seeds"]:  # an input that yields nothing: an error under strict=true
            task = task_settings(self.settings)
            source = f"seeds_path {task.seeds_path}" if task.seeds_path else "the seed generator"
            message = f"no usable seed: {source} yielded none ({counts['rejected']} rejected)"
            if strict:
                failure = f"{message}; strict=true (prompt files were not written)"
            else:
                log.warning(message)
        if failure is not None:
            for name in (SEEDS, PROMPTS):
                (out / name).unlink(missing_ok=True)
                parquet_path(out / name).unlink(missing_ok=True)
            raise DataError(failure)
        self.manifest = seed_manifest(
            self.settings, template=first.template, counts=counts, files=files, parquet=parquet
        )
        if executor is not None:
            self.manifest["executor"] = executor
        write_json_atomic(out / MANIFEST, self.manifest)
        log.info(
            "wrote %d seeds (%d train, %d val), %d rejected, to %s%s",
            counts["seeds"],
            counts["train"],
            counts["val"],
            counts["rejected"],
            out,
            f" ({shards} shards)" if shards > 1 else "",
        )

    def _merge_judge(self, figures: list[dict[str, Any]]) -> None:
        self.manifest["judge"] = plain(figures[0])

    def _check_judge_errors(self) -> None:
        """Stop before any export is written when judge errors take the run's errors over
        ``provider.max_error_rate``: an answer with no verdict is a rejected one, so writing
        would replace good exports (of an earlier run, ``stage=judge``) with fewer rows."""
        provider = self.settings.provider
        assert provider is not None
        counts = run_error_counts(self.manifest)
        if not counts.judge_errors or not counts.exceeds(provider.max_error_rate):
            return
        write_json_atomic(self.out_dir / MANIFEST, self.manifest)  # the figures of what was done
        judge = self.manifest.get("regeneration", {}).get("judge", {})
        kinds = ", ".join(f"{kind}: {n}" for kind, n in judge.get("errors", {}).items())
        raise ProviderError(
            f"judge: {counts.judge_errors} of {counts.judged} judged answer(s) got no valid verdict"
            f"{f' ({kinds})' if kinds else ''}: {counts.describe()}, more than "
            f"provider.max_error_rate={provider.max_error_rate:g}; no export was written (those of an "
            "earlier run are left as they were); check the judge (judge.provider, "
            "judge.structured_output, judge.max_tokens) and rerun"
        )

    def _merge_generated(self, shards: list[Generated], estimate: CostEstimate) -> None:
        provider = self.settings.provider
        assert provider is not None
        if self._dirs == [self.out_dir]:  # one shard, the run directory itself: nothing to merge
            one = shards[0]
            assert one.completions is not None and one.generation is not None
            completions, generation, regeneration = one.completions, one.generation, one.regeneration
            meter = one.meter
        else:
            meter, regeneration = merge_shard_chains(
                self.settings,
                self.out_dir,
                self._dirs,
                shards,
                self._positions(),
                limit=provider.max_cost_usd,
            )
            from storyforge.jobs.regenerate import ATTEMPTS

            completions = self.out_dir / (ATTEMPTS if regeneration is not None else GENERATIONS)
            generation = combine_stats([shard.generation for shard in shards if shard.generation is not None])
            generation["wall_time_s"] = round(time.perf_counter() - self._started, 3)
            judge = (regeneration or {}).get("judge")
            if judge is not None:  # the shards logged their own passes on their workers
                from storyforge.jobs.judge import verdict_line

                line = verdict_line(
                    f"judge, {len(shards)} shards", judge["verdicts"], judge.get("errors") or {}
                )
                (log.warning if judge["verdicts"]["error"] else log.info)("%s", line)
        self._chains = Generated(
            completions=completions, generation=generation, regeneration=regeneration, meter=meter
        )
        self._estimate = estimate
        self.manifest["generation"] = plain(generation)
        if regeneration is not None:
            self.manifest["regeneration"] = plain(regeneration)
        self._check_judge_errors()

    def _positions(self) -> dict[str, int]:
        """Each seed id's position in the merged files."""
        return {seed_id: position for shard in self._rendered for position, seed_id in shard.seeds}

    def _provenance_served(self) -> None:
        """The rows' provenance names the model as its server reported it, when the manifest
        records that (generation has run by now)."""
        export = self.settings.export
        served = export.provenance.with_served(self.manifest)
        if served is not export.provenance:
            self.settings = replace(self.settings, export=replace(export, provenance=served))

    def finish(self) -> dict[str, Any]:
        """Batch files (``stage=batch_export``), the final manifest, and the error-rate check."""
        out, manifest = self.out_dir, self.manifest
        if self.settings.stage == "batch_export":
            return batch_export(self.settings, out, out / PROMPTS, manifest)
        if "generation" in manifest or "completions" in manifest:
            write_json_atomic(out / MANIFEST, manifest)
        provider = self.settings.provider
        if provider is not None:
            # After every file is written: what succeeded is kept, and the run still fails loudly.
            counts = run_error_counts(manifest)
            if counts.exceeds(provider.max_error_rate):
                raise ProviderError(
                    f"{counts.describe()}, more than provider.max_error_rate="
                    f"{provider.max_error_rate:g}; the files are written ({out}); rerun into the same "
                    "directory to retry the failed requests"
                )
        if self.drift is not None:
            from storyforge.drift.stage import run_gate

            if not (out / SFT).is_file():
                raise DataError(
                    "stage=drift checks sft.jsonl, which this run did not write (set completions= or a provider)"
                )
            manifest = {**manifest, "drift": run_gate(self.drift, out)}
        return manifest


def seed_manifest(
    run_settings: RunSettings,
    *,
    template: str,
    counts: dict[str, Any],
    files: dict[str, Any],
    parquet: dict[str, Any],
) -> dict[str, Any]:
    """The manifest once the seed files and their Parquet twins are written (every executor)."""
    settings = task_settings(run_settings)
    return {
        "task": "tinystories",
        "storyforge_version": storyforge.__version__,
        "config_sha256": run_settings.config_sha256,
        "template": template,
        "seed_source": "file" if settings.seeds_path is not None else "generated",
        **({"inputs": dict(run_settings.inputs)} if run_settings.inputs else {}),
        "counts": counts,
        "files": files,
        "parquet": parquet,
    }


def batch_export(
    run_settings: RunSettings, out_dir: Path, prompts_path: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    """``stage=batch_export``: Batch API input files instead of live requests."""
    from storyforge.providers.batch_files import export_batch_files

    manifest["batch_export"] = export_batch_files(run_settings.generation, out_dir, prompts_path)
    write_json_atomic(out_dir / MANIFEST, manifest)
    return manifest


def plain(value: Any) -> Any:
    """Stats objects as JSON-ready data (dataclasses and mappings become dicts)."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
