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

Why it is shaped this way: records stream from the generator (or the seeds file) through
validation and rendering straight into temp files, so memory stays flat in ``n_seeds``; the
files replace their targets only when complete; nothing written depends on the clock, the
environment or the run directory, so re-running the ``.hydra`` snapshot gives the same bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

import storyforge
from storyforge.atomic import write_json_atomic
from storyforge.config.settings import RunSettings
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import ConfigError, DataError
from storyforge.executors import run_sharded, sort_generations
from storyforge.tasks.tinystories.instruction import InstructionRenderer
from storyforge.tasks.tinystories.seed_validation import Rejection, SeedValidator
from storyforge.tasks.tinystories.seeds import SeedGenerator, audit_seeds, read_seed_lines
from storyforge.tasks.tinystories.tables import parquet_path, twinned_lines, write_parquet

if TYPE_CHECKING:
    from storyforge.providers.cost import CostMeter

__all__ = ["MANIFEST", "PROMPTS", "REJECTED", "SEEDS", "batch_export", "plain", "run", "seed_manifest"]

log = logging.getLogger(__name__)

SEEDS = "prompts_seed.jsonl"
PROMPTS = "prompts.jsonl"
REJECTED = "rejected_seeds.jsonl"
MANIFEST = "manifest.json"


def run(run_settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    """Write the run's seeds, prompts, rejects and manifest; return the manifest.

    ``stage=drift`` then runs the train/serve gate (:mod:`storyforge.drift`) on the run's
    ``sft.jsonl`` with the ``drift`` group's serving sides (``drift_report.json``)."""
    drift = None
    if run_settings.stage == "drift":
        from storyforge.drift.stage import gate_options

        drift = gate_options(run_settings.drift, exports=(out_dir / "sft.jsonl",))
        if drift is None:
            raise ConfigError(
                "stage=drift needs drift.tokenizer=DIR (the folder of the model's tokenizer files)"
            )
    manifest = _run(run_settings, out_dir)
    if drift is not None:
        from storyforge.drift.stage import run_gate

        if not (out_dir / "sft.jsonl").is_file():
            raise DataError(
                "stage=drift checks sft.jsonl, which this run did not write (set completions= or a provider)"
            )
        manifest = {**manifest, "drift": run_gate(drift, out_dir)}
    return manifest


def _run(run_settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    # Regeneration (storyforge.config.regenerate), checked before anything is written.
    regen = run_settings.regenerate
    if regen.enabled and run_settings.provider is None:
        raise ConfigError(
            "regenerate.max_attempts > 1 asks a model again; choose provider=openai or provider=ollama"
        )
    if run_settings.executor.name != "local":
        if regen.enabled or run_settings.judge.enabled:
            raise ConfigError(
                "regenerate.max_attempts > 1 and judge=... run with executor=local; "
                "executor=ray does not regenerate or judge yet"
            )
        if run_settings.provider is not None and run_settings.provider.max_cost_usd is not None:
            raise ConfigError(
                "provider.max_cost_usd runs with executor=local; executor=ray does not meter cost yet"
            )
        return run_sharded(run_settings, out_dir)
    judge = run_settings.judge
    if judge.enabled and run_settings.provider is None:
        raise ConfigError("judge=... asks a judge model; choose provider=openai or provider=ollama")
    if run_settings.stage == "judge" and not judge.enabled:
        raise ConfigError("stage=judge adds a judge to a finished run; choose a judge (judge=content_safety)")
    settings = _task(run_settings)
    provider = run_settings.provider
    if provider is not None:
        from storyforge.providers.runner import build_provider

        # Settings (model, API key variable, limits) are checked before any file is written.
        build_provider(provider)
        if judge.enabled:
            from storyforge.jobs.judge import judge_provider_conf

            build_provider(judge_provider_conf(provider, judge))
    out_dir.mkdir(parents=True, exist_ok=True)
    renderer = InstructionRenderer(settings.template, max_tokens=settings.max_tokens)
    validator = SeedValidator(settings.constraints)

    if settings.seeds_path is not None:
        log.info("loading seeds from %s (task.n_seeds is ignored)", settings.seeds_path)
        items: Iterator[dict[str, Any] | Rejection] = audit_seeds(
            read_seed_lines(settings.seeds_path), validator, renderer
        )
        total = None
    else:
        items = _generate(settings, validator, renderer)
        total = settings.n_seeds

    seeds_path, prompts_path = out_dir / SEEDS, out_dir / PROMPTS
    system = [{"role": "system", "content": settings.system_message}] if settings.system_message else []
    splits = {"train": 0, "val": 0}
    # Each file and its Parquet twin are written together from the same lines, the writing,
    # hashing and twin building on worker threads (see TwinnedLines).
    with (
        twinned_lines(seeds_path) as seeds_out,
        twinned_lines(prompts_path) as prompts_out,
    ):
        with twinned_lines(out_dir / REJECTED) as rejected_out:
            for item in tqdm(items, total=total, desc="tinystories seeds", unit="seed", disable=None):
                if isinstance(item, Rejection):
                    rejected_out.write(item.as_record())
                    log.warning("rejected %s", item)
                    continue
                seeds_out.write(item)
                prompts_out.write(
                    {
                        "id": item["id"],
                        "split": item["split"],
                        "messages": [*system, {"role": "user", "content": item["instruction"]}],
                    }
                )
                splits[item["split"]] += 1
        if rejected_out.count and settings.strict:
            raise DataError(
                f"{rejected_out.count} seed record(s) rejected with strict=true; "
                f"see {rejected_out.path} (prompt files were not written)"
            )

    manifest = seed_manifest(
        run_settings,
        template=renderer.name,
        counts={"seeds": seeds_out.count, **splits, "rejected": rejected_out.count},
        files={
            SEEDS: seeds_out.summary(),
            PROMPTS: prompts_out.summary(),
            REJECTED: rejected_out.summary(),
        },
        out_dir=out_dir,
        parquet={out.twin_target.name: out.twin_summary() for out in (seeds_out, prompts_out, rejected_out)},
    )
    write_json_atomic(out_dir / MANIFEST, manifest)
    log.info(
        "wrote %d seeds (%d train, %d val), %d rejected, to %s",
        seeds_out.count,
        splits["train"],
        splits["val"],
        rejected_out.count,
        out_dir,
    )

    if run_settings.stage == "batch_export":
        return batch_export(run_settings, out_dir, prompts_path, manifest)
    completions_path: Path | None = None
    meter = None
    if provider is not None:
        from storyforge.jobs.costing import estimate_record, open_meter
        from storyforge.providers.runner import generate_for_job

        # Cost (storyforge.config.pricing): the estimate is logged and checked before any request.
        meter, estimate = open_meter(
            provider, run_settings.pricing, prompts_path, attempts=regen.max_attempts, judged=judge.enabled
        )
        # stage=judge: the generation answers must all be in the journals already.
        require_done = "stage=judge" if run_settings.stage == "judge" else None
        completions_path, gen_stats = generate_for_job(
            run_settings.generation, out_dir, prompts_path, meter=meter, require_done=require_done
        )
        sort_generations(completions_path, prompts_path)  # the order every executor writes
        manifest["generation"] = plain(gen_stats)
        if regen.enabled or judge.enabled:  # judge, then attempts 2..K (storyforge.jobs.regenerate)
            from storyforge.jobs.regenerate import regenerate

            completions_path, regen_stats = regenerate(
                run_settings.generation,
                out_dir,
                seeds_path,
                prompts_path,
                completions_path,
                regen,
                max_chars=run_settings.export.max_chars,
                meter=meter,
                judge=judge,
                require_done=require_done,
            )
            manifest["regeneration"] = plain(regen_stats)
    elif settings.completions is not None:
        completions_path = settings.completions
    if completions_path is not None:
        from storyforge.tasks.tinystories.outputs import process_completions

        # The cost section when the model is priced (pricing.models); an unpriced one costs nothing.
        cost = _cost_section(meter) if meter is not None and meter.priced else None
        summary = process_completions(
            run_settings.export,
            out_dir,
            seeds_path,
            prompts_path,
            completions_path,
            dedup=run_settings.dedup,
            diversity=run_settings.diversity,
            cost=cost,
        )
        manifest["completions"] = plain(summary)
        if cost is not None and meter is not None:
            manifest["cost"] = {
                **summary["cost"],
                "this_run": meter.run_summary(),
                "estimate": estimate_record(estimate),
            }
    if "generation" in manifest or "completions" in manifest:
        write_json_atomic(out_dir / MANIFEST, manifest)
    if provider is not None:
        from storyforge.providers.runner import check_error_rate

        # After every file is written: what succeeded is kept, and the run still fails loudly.
        check_error_rate(manifest["generation"], provider.max_error_rate, out_dir / "generations.jsonl")
    return manifest


def _task(run_settings: RunSettings) -> TinyStoriesSettings:
    settings = run_settings.task
    assert isinstance(settings, TinyStoriesSettings), "the TinyStories job runs task=tinystories"
    return settings


def seed_manifest(
    run_settings: RunSettings,
    *,
    template: str,
    counts: dict[str, Any],
    files: dict[str, Any],
    out_dir: Path,
    parquet: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest once the seed files are written, with their Parquet twins (every executor):
    ``parquet`` when they were written with the files, else written now from the files."""
    settings = _task(run_settings)
    return {
        "task": "tinystories",
        "storyforge_version": storyforge.__version__,
        "config_sha256": run_settings.config_sha256,
        "template": template,
        "seed_source": "file" if settings.seeds_path is not None else "generated",
        **({"inputs": dict(run_settings.inputs)} if run_settings.inputs else {}),
        "counts": counts,
        "files": files,
        "parquet": parquet
        or {
            parquet_path(out_dir / name).name: write_parquet(out_dir / name)
            for name in (SEEDS, PROMPTS, REJECTED)
        },
    }


def batch_export(
    run_settings: RunSettings, out_dir: Path, prompts_path: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    """``stage=batch_export``: Batch API input files instead of live requests."""
    from storyforge.providers.batch_files import export_batch_files

    manifest["batch_export"] = export_batch_files(run_settings.generation, out_dir, prompts_path)
    write_json_atomic(out_dir / MANIFEST, manifest)
    return manifest


def _generate(
    settings: TinyStoriesSettings, validator: SeedValidator, renderer: InstructionRenderer
) -> Iterator[dict[str, Any] | Rejection]:
    """Generated seeds with their instructions; one that misses the token budget is rejected."""
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


def _cost_section(meter: CostMeter) -> Callable[[int], dict[str, Any]]:
    """The report's cost section for a given number of passing samples."""

    def section(passed: int) -> dict[str, Any]:
        return meter.summary(passed=passed)

    return section


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
