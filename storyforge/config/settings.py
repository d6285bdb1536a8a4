"""The composed config, once, as frozen typed settings: :class:`RunSettings` and its parts.

Takes: the composed Hydra config (``DictConfig``) at the start of a run. Gives:
:func:`read_settings`, which checks every group the run uses (each error names its key in one
line, as the checks always have) and returns a :class:`RunSettings`; and the parts it holds:
the task's own settings (:data:`TaskSettings`), the provider (the checked
:class:`~storyforge.config.provider.ProviderConf`, or ``None`` for ``provider=none``), the
executor, the response cache and the export options.

Why: the composed config is read here and nowhere below :mod:`storyforge.pipeline`. Jobs,
executors, providers and tasks receive these objects (or the part they need), so a key is
checked once, its type is known to mypy, and a Ray worker gets plain picklable values (paths
already absolute) instead of a config tree to read again.

One type per group: a schema must stay mutable (OmegaConf makes the node of a frozen
dataclass read-only, and Hydra's overrides then fail to merge), so the schemas the code uses as
they are (provider, executor, drift, export, dedup with its diversity, regenerate, research
QA's model and task) are :class:`~storyforge.sealed.Sealed`: checked, converted once, then
sealed (setting an attribute raises ``FrozenInstanceError``). A value derived from a group is a property or a small
function of its schema, not a second type; the task parts (:data:`TaskSettings`) gather what
several groups decide (seed constraints, a frozen prompt format, an absolute input path).

Adding a config group (for example ``judge``): write ``storyforge/config/judge.py`` with the
schema dataclass (``JudgeConf(Sealed)``, stored as ``judge/base_judge`` by its
``register(cs)``; in the task's own module when a task reads it) and ``def settings(cfg:
DictConfig) -> JudgeConf`` (defaults when the group is absent; ``ConfigError`` naming
``judge.<key>`` otherwise; sealed); list the module in ``storyforge.config._MODULES``; add
``judge: JudgeConf`` to :class:`RunSettings` and ``judge=judge.settings(cfg)`` to
:func:`read_settings`. Code below the pipeline then reads ``settings.judge``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from storyforge.config.common import config_sha256, data_config_sha256, validate_run
from storyforge.config.dedup import dedup_settings
from storyforge.config.drift import DriftConf
from storyforge.config.drift import settings as drift_settings
from storyforge.config.executor import ExecutorConf, executor_settings
from storyforge.config.exports import export_options
from storyforge.config.inputs import inputs_of
from storyforge.config.judge import JudgeSettings, judge_settings
from storyforge.config.pricing import PricingSettings, pricing_settings, require_price
from storyforge.config.provider import (
    CacheSettings,
    GenerationSettings,
    ProviderConf,
    cache_settings,
    check_replay_cache,
    max_completion_tokens,
    provider_settings,
)
from storyforge.config.regenerate import RegenerateConf, regenerate_settings
from storyforge.config.research_qa import ResearchQASettings
from storyforge.config.storyforge_tasks import RenderTaskSettings
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import ConfigError
from storyforge.quality.dedup import DedupConf
from storyforge.tasks.tinystories.exports import ExportOptions

__all__ = [
    "SAME_REQUEST_AGAIN",
    "CacheSettings",
    "GenerationSettings",
    "RunSettings",
    "TaskSettings",
    "check_before_sending",
    "check_tinystories_run",
    "read_settings",
]

TaskSettings = TinyStoriesSettings | ResearchQASettings | RenderTaskSettings
"""The ``task`` part: one settings class per job kind."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """Everything a run reads from its config, checked and frozen (see the module docstring)."""

    job: str
    """``task.job``: the dotted name of the job function (``storyforge.jobs.tinystories.run``)."""
    task: TaskSettings
    provider: ProviderConf | None = None
    """The model server (sealed), or ``None`` when the run sends no requests (``provider=none``)."""
    executor: ExecutorConf = field(default_factory=ExecutorConf)
    cache: CacheSettings = field(default_factory=CacheSettings)
    export: ExportOptions = field(default_factory=ExportOptions)
    dedup: DedupConf = field(default_factory=lambda: DedupConf(enabled=False).seal())
    """Near-duplicates of the completions and how much of each group the diversity figures
    read (the ``dedup`` group with ``dedup.diversity``; no repeat search when the group is absent)."""
    drift: DriftConf = field(default_factory=lambda: DriftConf().seal())
    """The train/serve gate (``stage=drift``; the Modelfile proof when a tokenizer is set)."""
    seed: int = 1234
    strict: bool = False
    resume: bool = False
    """``+resume=true``: the run says it means to continue an earlier one (only logged)."""
    stage: str | None = None
    config_sha256: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    """The pinned input files (``{key: {path, sha256}}``), for the manifest; empty when none."""
    regenerate: RegenerateConf = field(default_factory=lambda: RegenerateConf().seal())
    """``regenerate``: ask again until an answer passes (:mod:`storyforge.jobs.regenerate`)."""
    pricing: PricingSettings = field(default_factory=PricingSettings)
    """``pricing``: USD per million tokens by model (:mod:`storyforge.providers.cost`)."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    """``judge``: a second model's structured verdict (:mod:`storyforge.jobs.judge`)."""

    @property
    def generation(self) -> GenerationSettings:
        """The parts generation reads (``provider=none`` gives the sealed ``none`` provider)."""
        return GenerationSettings(
            provider=self.provider if self.provider is not None else ProviderConf().seal(),
            cache=self.cache,
            strict=self.strict,
            resume=self.resume,
        )


def read_settings(cfg: DictConfig) -> RunSettings:
    """Check ``cfg`` and return its :class:`RunSettings`; :class:`ConfigError` names the key."""
    job = str(cfg.task.job)
    reader = _TASK_READERS.get(job)
    if reader is None:
        raise ConfigError(f"task.job {job!r} is not a storyforge job; known: {', '.join(_TASK_READERS)}")
    task: TaskSettings = importlib.import_module(reader).check(cfg)
    tinystories = isinstance(task, TinyStoriesSettings)
    # Only TinyStories sends requests and writes exports; the other tasks never read these groups.
    provider = provider_settings(cfg) if tinystories else None
    run = validate_run(cfg)
    cache = cache_settings(cfg)
    dedup = dedup_settings(cfg) if tinystories else DedupConf(enabled=False).seal()
    regenerate = regenerate_settings(cfg) if tinystories else RegenerateConf().seal()
    pricing = pricing_settings(cfg) if tinystories else PricingSettings()
    if provider is not None and provider.name != "none":
        check_before_sending(provider, regenerate, pricing)
    settings = RunSettings(
        job=job,
        task=task,
        provider=provider,
        executor=executor_settings(cfg),
        cache=cache,
        export=export_options(cfg, max_tokens=max_completion_tokens(provider) if provider else None)
        if tinystories
        else ExportOptions(strict=run.strict),
        dedup=dedup,
        drift=drift_settings(cfg),
        seed=run.seed,
        strict=run.strict,
        resume=bool(cfg.get("resume", False)),
        stage=None if cfg.get("stage") is None else str(cfg.stage),
        config_sha256=config_sha256(cfg),
        inputs=inputs_of(cfg),
        regenerate=regenerate,
        pricing=pricing,
        judge=judge_settings(cfg) if tinystories else JudgeSettings(),
    )
    if not tinystories:
        return settings
    from storyforge.tasks.tinystories.provenance import run_provenance

    provenance = run_provenance(  # each exported row's
        template=getattr(settings.task, "template", None),
        provider=settings.provider,
        judge_enabled=settings.judge.enabled,
        judge_template=settings.judge.template,
        config_sha256=data_config_sha256(cfg),
    )
    return replace(settings, export=replace(settings.export, provenance=provenance))


def check_before_sending(
    provider: ProviderConf, regenerate: RegenerateConf, pricing: PricingSettings
) -> None:
    """The rules between groups that would otherwise stop a run after requests were sent."""
    require_price(pricing, str(getattr(provider, "model", "")), provider.max_cost_usd)
    if regenerate.max_attempts > 1 and not regenerate.feedback:
        options = getattr(provider, "options", None)
        seed = options.get("seed") if isinstance(options, dict) else getattr(provider, "seed", None)
        if seed is None:
            raise ConfigError(SAME_REQUEST_AGAIN)


SAME_REQUEST_AGAIN = (
    "regenerate.feedback=false sends the prompt again, and without a sampling seed "
    "the request is the same as the one that failed (the cache would answer it "
    "with the same text); set provider.seed (provider.options.seed for Ollama) "
    "or use regenerate.feedback=true"
)
"""Why a regeneration without feedback needs a sampling seed (checked here, and again on the
request itself when one is built)."""


def check_tinystories_run(run: RunSettings, journal: Path) -> None:
    """The TinyStories rules between groups (provider, cache, regenerate, judge, completions,
    stage), checked before any file is written; ``journal``: the run directory's
    ``generations.jsonl`` (a run directory whose journal holds the answers replays on its own)."""
    regen, judge, provider = run.regenerate, run.judge, run.provider
    if regen.enabled and provider is None:
        raise ConfigError(
            "regenerate.max_attempts > 1 asks a model again; choose provider=openai or provider=ollama"
        )
    if judge.enabled and provider is None:
        raise ConfigError("judge=... asks a judge model; choose provider=openai or provider=ollama")
    completions = getattr(run.task, "completions", None)
    if completions is not None and provider is not None and not judge.enabled:
        raise ConfigError(
            f"completions={completions} gives the answers to check, and provider={provider.name} would "
            "generate new ones; drop one of the two (to judge the file, add judge=NAME: the provider "
            "then serves the judge only)"
        )
    if completions is not None and regen.enabled:
        raise ConfigError(
            "regenerate.max_attempts > 1 asks a model again, which a completions file cannot be; "
            "drop completions= or set regenerate.max_attempts=1"
        )
    if run.stage == "judge" and not judge.enabled:
        raise ConfigError("stage=judge adds a judge to a finished run; choose a judge (judge=content_safety)")
    if provider is not None:
        check_replay_cache(
            provider.replay,
            run.cache,
            unanswered=None if journal.is_file() else f"there is no {journal.name} in {journal.parent}",
        )


_TASK_READERS: dict[str, str] = {
    "storyforge.jobs.tinystories.run": "storyforge.config.tinystories",
    "storyforge.jobs.research_qa.run": "storyforge.config.research_qa",
    "storyforge.jobs.render_task.run": "storyforge.config.storyforge_tasks",
}
"""``task.job`` -> the module whose ``check(cfg)`` reads its task settings (imported when
needed; a new job adds its line here)."""
