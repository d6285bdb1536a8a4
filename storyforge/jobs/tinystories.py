"""The TinyStories job: config -> prompt seeds -> instructions -> prompts, in the run directory.

Takes: the composed config and the Hydra run directory. Gives (files in ``out_dir``):
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

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import storyforge
from storyforge.atomic import write_json_atomic
from storyforge.config.common import config_sha256
from storyforge.config.pricing import pricing_settings
from storyforge.config.regenerate import regenerate_settings
from storyforge.config.tinystories import TinyStoriesSettings, check
from storyforge.errors import ConfigError, DataError
from storyforge.executors import executor_name, run_sharded, sort_generations
from storyforge.inputs import inputs_of
from storyforge.tasks.tinystories.instruction import InstructionRenderer
from storyforge.tasks.tinystories.seed_validation import Rejection, SeedValidator
from storyforge.tasks.tinystories.seeds import SeedGenerator, audit_seeds, read_seed_lines
from storyforge.tasks.tinystories.tables import parquet_path, twinned_lines, write_parquet

if TYPE_CHECKING:
    from storyforge.providers.cost import CostMeter

__all__ = ["MANIFEST", "PROMPTS", "REJECTED", "SEEDS", "run"]

log = logging.getLogger(__name__)

SEEDS = "prompts_seed.jsonl"
PROMPTS = "prompts.jsonl"
REJECTED = "rejected_seeds.jsonl"
MANIFEST = "manifest.json"


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Write the run's seeds, prompts, rejects and manifest; return the manifest."""
    # Regeneration settings, checked before anything is written (storyforge.config.regenerate).
    regen = regenerate_settings(cfg)
    if regen.enabled and cfg.provider.name == "none":
        raise ConfigError(
            "regenerate.max_attempts > 1 asks a model again; choose provider=openai or provider=ollama"
        )
    if executor_name(cfg) != "local":
        if regen.enabled:
            raise ConfigError(
                "regenerate.max_attempts > 1 runs with executor=local; executor=ray does not regenerate yet"
            )
        return run_sharded(cfg, out_dir)
    settings = check(cfg)
    provider = None
    if cfg.provider.name != "none":
        from storyforge.providers.runner import build_provider, provider_conf

        # Settings (model, API key variable, limits) are checked before any file is written.
        provider = provider_conf(cfg)
        build_provider(provider)
    out_dir.mkdir(parents=True, exist_ok=True)
    template = OmegaConf.to_container(cfg.template, resolve=True)
    renderer = InstructionRenderer(template, max_tokens=settings.max_tokens)
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
        cfg,
        settings,
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

    if cfg.get("stage") == "batch_export":
        return _batch_export(cfg, out_dir, prompts_path, manifest)
    completions_path: Path | None = None
    meter = None
    if provider is not None:
        from storyforge.jobs.costing import estimate_record, open_meter
        from storyforge.providers.runner import generate_for_job

        # Cost (storyforge.config.pricing): the estimate is logged and checked before any request.
        meter, estimate = open_meter(
            provider, pricing_settings(cfg), prompts_path, attempts=regen.max_attempts
        )
        completions_path, gen_stats = generate_for_job(cfg, out_dir, prompts_path, meter=meter)
        sort_generations(completions_path, prompts_path)  # the order every executor writes
        manifest["generation"] = _plain(gen_stats)
        if regen.enabled:  # attempts 2..K for the samples that failed (storyforge.jobs.regenerate)
            from storyforge.jobs.regenerate import regenerate
            from storyforge.tasks.tinystories.exports import ExportOptions

            completions_path, regen_stats = regenerate(
                cfg,
                out_dir,
                seeds_path,
                prompts_path,
                completions_path,
                regen,
                max_chars=ExportOptions.from_config(cfg).max_chars,
                meter=meter,
            )
            manifest["regeneration"] = _plain(regen_stats)
    elif cfg.completions:
        completions_path = settings.completions
    if completions_path is not None:
        from storyforge.tasks.tinystories.outputs import process_completions

        cost = _cost_section(meter) if meter is not None else None
        summary = process_completions(cfg, out_dir, seeds_path, prompts_path, completions_path, cost=cost)
        manifest["completions"] = _plain(summary)
        if meter is not None:
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


def seed_manifest(
    cfg: DictConfig,
    settings: TinyStoriesSettings,
    *,
    template: str,
    counts: dict[str, Any],
    files: dict[str, Any],
    out_dir: Path,
    parquet: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest once the seed files are written, with their Parquet twins (every executor):
    ``parquet`` when they were written with the files, else written now from the files."""
    return {
        "task": "tinystories",
        "storyforge_version": storyforge.__version__,
        "config_sha256": config_sha256(cfg),
        "template": template,
        "seed_source": "file" if settings.seeds_path is not None else "generated",
        **({"inputs": inputs} if (inputs := inputs_of(cfg)) else {}),
        "counts": counts,
        "files": files,
        "parquet": parquet
        or {
            parquet_path(out_dir / name).name: write_parquet(out_dir / name)
            for name in (SEEDS, PROMPTS, REJECTED)
        },
    }


def _batch_export(
    cfg: DictConfig, out_dir: Path, prompts_path: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    """``stage=batch_export``: Batch API input files instead of live requests."""
    from storyforge.providers.batch_files import export_batch_files

    manifest["batch_export"] = export_batch_files(cfg, out_dir, prompts_path)
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


def _plain(value: Any) -> Any:
    """Stats objects as JSON-ready data (dataclasses and mappings become dicts)."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
