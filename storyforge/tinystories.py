"""The TinyStories job from Python: its seeds, its output checks and the whole run.

Takes: the overrides ``python run.py task=tinystories`` takes (``"task.n_seeds=50"``,
``"constraints.min_sentences=4"``, ``"provider=openai"``...), composed with Hydra's compose API
from the same ``conf/``; or the typed settings they give. Gives: :func:`compose_settings` (the checked
:class:`~storyforge.config.settings.RunSettings`), :func:`draw_seeds` (the records
``prompts_seed.jsonl`` holds, in memory), :func:`validate` (the seed specification's checks of
one story: a verdict with failure labels) and :func:`run` (the job ``run.py`` runs, into a
folder you name; without the Hydra snapshot ``.hydra/`` and ``run.log``, which only ``run.py``
writes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from storyforge.config.settings import RunSettings
from storyforge.errors import ConfigError, DataError
from storyforge.tasks.tinystories.validate import MAX_CHARS, ValidationResult, validate_output

__all__ = ["compose_settings", "draw_seeds", "run", "validate"]

log = logging.getLogger(__name__)


def compose_settings(overrides: Sequence[str] = ()) -> RunSettings:
    """The checked settings of ``python run.py task=tinystories OVERRIDES`` (a bad key or value
    is a :class:`~storyforge.errors.ConfigError` naming it)."""
    from hydra import compose, initialize_config_dir

    from storyforge.config import register_configs
    from storyforge.config.hydra_errors import refuse_unknown_top_level, report
    from storyforge.config.settings import read_settings
    from storyforge.jobs.render_task import conf_dir

    register_configs()
    conf = conf_dir()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base=None):
            cfg = compose("config", overrides=["task=tinystories", *overrides])
    except Exception as exc:
        found = report(exc)  # the one line run.py prints for it
        if found is None:
            raise
        raise ConfigError(found[0].removeprefix("error: ")) from None
    groups = [entry.name for entry in conf.iterdir() if entry.is_dir()]
    refuse_unknown_top_level([str(key) for key in cfg], conf / "config.yaml", groups)
    return read_settings(cfg)


def draw_seeds(n: int, *, seed: int | None = None, overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The first ``n`` generated seed records with their instructions, as ``prompts_seed.jsonl``
    holds them after ``python run.py task=tinystories task.n_seeds=N seed=SEED OVERRIDES``.

    ``seed``: the run's ``seed`` (default: the config's). A seed whose instruction cannot be
    rendered (``budget.max_tokens`` too small) is left out and logged, as the job rejects it.
    """
    from storyforge.config.tinystories import TinyStoriesSettings
    from storyforge.tasks.tinystories.instruction import InstructionRenderer
    from storyforge.tasks.tinystories.seed_validation import SeedValidator
    from storyforge.tasks.tinystories.seeds import SeedGenerator

    chosen = [f"task.n_seeds={n}", *([] if seed is None else [f"seed={seed}"]), *overrides]
    task = compose_settings(chosen).task
    if not isinstance(task, TinyStoriesSettings):  # an override chose another task
        raise ConfigError("draw_seeds draws TinyStories seeds; do not override task=")
    if task.seeds_path is not None:
        raise ConfigError("draw_seeds draws seeds from the pools; seeds_path loads them from a file instead")
    generator = SeedGenerator(
        seed=task.seed,
        themes=task.themes,
        constraints=task.constraints,
        protagonists=task.pools.protagonists,
        objects=task.pools.objects,
        banned=task.pools.banned,
        id_prefix=task.id_prefix,
        val_fraction=task.val_fraction,
    )
    renderer = InstructionRenderer(task.template, max_tokens=task.max_tokens)
    validator = SeedValidator(task.constraints)
    records: list[dict[str, Any]] = []
    for index in range(n):
        record = generator.record(index)
        try:
            record["instruction"] = renderer(record)
        except DataError as exc:
            log.warning("seed %s left out: %s", record["id"], exc)
            continue
        rejection = validator.check(record)
        if rejection is not None:  # the generator breaking its own rules: a defect
            raise AssertionError(f"generated {rejection}")
        records.append(record)
    return records


def validate(seed_record: Mapping[str, Any], text: object, *, max_chars: int = MAX_CHARS) -> ValidationResult:
    """The seed specification's checks of ``text`` written for ``seed_record`` (a
    ``prompts_seed.jsonl`` record): ``passed``, ``labels`` (``missing_required``,
    ``contains_banned``, ``wrong_sentence_count``, ``too_long``, ``other``), ``sentence_count``
    and ``reasons``. A seed without usable fields is a :class:`~storyforge.errors.DataError`."""
    return validate_output(seed_record, text, max_chars=max_chars)


def run(
    out_dir: str | Path, overrides: Sequence[str] = (), *, settings: RunSettings | None = None
) -> dict[str, Any]:
    """Run the TinyStories job into ``out_dir`` and return its summary (the manifest's counts).

    ``overrides`` as ``run.py`` takes them; or ``settings`` (from :func:`compose_settings`, possibly
    changed with :func:`dataclasses.replace`). Another run writing into ``out_dir`` at the same
    time is refused, and a rerun resumes, as with ``run.py``.
    """
    from storyforge.atomic import clean_stale_temps
    from storyforge.pipeline import run_settings
    from storyforge.run_lock import hold_run_dir

    chosen = compose_settings(overrides) if settings is None else settings
    out = Path(out_dir).absolute()
    with hold_run_dir(out):
        for stale in clean_stale_temps(out):
            log.info("removed %s, left by an earlier run that was stopped", stale)
        summary: dict[str, Any] = run_settings(chosen, out)
    return summary
