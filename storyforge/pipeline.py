"""The Hydra job: composed config -> the selected task's job -> files in the run directory.

Takes: the composed ``DictConfig``. First the input files it names are made absolute and
their sha256 pinned in the run snapshot (:mod:`storyforge.config.inputs`); then the config is
read, once, into frozen :class:`~storyforge.config.settings.RunSettings`, from which ``task.job``
builds the job (:mod:`storyforge.jobs.base`) that the executor ``executor.name`` selects runs. Gives: whatever the task's job returns (a summary mapping used by sweep summaries). The job to run is named by ``task.job``
(``storyforge.jobs.tinystories.run``); only callables under ``storyforge.`` are accepted.
"""

from __future__ import annotations

import copy
import importlib
import logging
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from storyforge.atomic import clean_stale_temps
from storyforge.config.hydra_errors import refuse_internal_choices, refuse_unknown_top_level, root_config_file
from storyforge.config.inputs import pin_inputs
from storyforge.config.settings import RunSettings, read_settings
from storyforge.errors import ConfigError
from storyforge.executors import execute
from storyforge.redaction import register_provider_secrets
from storyforge.run_lock import LOCK_NAME, hold_run_dir
from storyforge.runfiles import MANIFEST
from storyforge.snapshot import HYDRA_SNAPSHOT_OFF, SNAPSHOT_DIR, committed_snapshot

log = logging.getLogger(__name__)


def output_dir() -> Path:
    """The current Hydra run (or sweep job) directory."""
    return Path(HydraConfig.get().runtime.output_dir)


def resolve_job(dotted: str) -> Any:
    """Import ``storyforge.<module>.<function>``; anything outside storyforge is refused."""
    if not dotted.startswith("storyforge."):
        raise ConfigError(f"task.job must name a callable inside storyforge, got {dotted!r}")
    module_name, _, attr = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"task.job {dotted!r} cannot be imported: {exc}") from exc


def run(cfg: DictConfig) -> Any:
    """Pin the run's input files, then run the job that ``cfg.task.job`` names in the output directory.

    When ``run.py`` told Hydra not to write the ``.hydra`` snapshot, the job writes the same
    files, once it holds the run lock (:mod:`storyforge.snapshot`).
    """
    hydra_cfg = HydraConfig.get()
    register_provider_secrets(cfg.get("provider"))  # before anything is written or said
    out = output_dir()
    write_snapshot = HYDRA_SNAPSHOT_OFF in hydra_cfg.overrides.hydra
    subdir = SNAPSHOT_DIR if write_snapshot else hydra_cfg.output_subdir
    pending = hydra_snapshot(cfg, hydra_cfg) if write_snapshot else None
    lock_name = f"{subdir}/run.lock" if subdir else LOCK_NAME  # beside the snapshot
    # The snapshot is written once the lock is held: a refused run never writes into it.
    with (
        hold_run_dir(out, wait=bool(cfg.get("wait", False)), lock_name=lock_name),
        committed_snapshot(out / subdir if subdir else None, pending) as snapshot,
    ):
        refuse_internal_choices(hydra_cfg.runtime.choices)
        refuse_unknown_top_level(
            [str(k) for k in cfg], root_config_file(hydra_cfg), hydra_cfg.runtime.choices.keys()
        )
        resolve_job(str(cfg.task.job))
        for stale in clean_stale_temps(out):  # the lock is held: no other run is writing here
            log.info("removed %s, left by an earlier run that was stopped", stale)
        pin_inputs(cfg, snapshot)
        return run_in(cfg, out)


def hydra_snapshot(cfg: DictConfig, hydra: Any) -> dict[str, str]:
    """The text of each file Hydra writes into ``.hydra`` as a job starts, by file name.

    ``cfg`` is the job's config and ``hydra`` Hydra's part (``HydraConfig.get()``) of a job run
    with :data:`~storyforge.snapshot.HYDRA_SNAPSHOT_OFF`: that override is left out of
    ``hydra.yaml``, whose ``output_subdir`` is the folder of the snapshot, as when Hydra writes it.
    """
    settings = copy.deepcopy(hydra)
    OmegaConf.set_readonly(settings, False)  # Hydra's own stays read-only
    settings.output_subdir = SNAPSHOT_DIR
    settings.overrides.hydra = [o for o in settings.overrides.hydra if o != HYDRA_SNAPSHOT_OFF]
    return {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml({"hydra": settings}),
        "overrides.yaml": OmegaConf.to_yaml(hydra.overrides.task),
    }


def run_in(cfg: DictConfig, out_dir: Path) -> Any:
    """Read ``cfg`` into :class:`~storyforge.config.settings.RunSettings` and run its job in ``out_dir``.

    The one place a composed config becomes settings: nothing the job calls sees ``cfg``.
    """
    resolve_job(str(cfg.task.job))
    return run_settings(read_settings(cfg), out_dir)


def run_settings(settings: RunSettings, out_dir: Path) -> Any:
    """Run the job ``settings.job`` names in ``out_dir`` on the executor ``settings.executor``
    names (a ``provider=llama_cpp`` server it started stops with it, however it ends), then
    write the run's dataset card."""
    factory = resolve_job(settings.job)
    if settings.provider is None or settings.provider.name != "llama_cpp":
        result = execute(factory(settings, Path(out_dir)), settings.executor)
    else:
        from storyforge.providers.llama_cpp import stop_servers

        try:
            result = execute(factory(settings, Path(out_dir)), settings.executor)
        finally:
            stop_servers()
    _write_card(Path(out_dir), settings)
    return result


def _write_card(out: Path, settings: Any) -> None:
    """The run's dataset card (README.md), when the run wrote exports (:mod:`storyforge.card`)."""
    from storyforge.card import CONFIGS, write_card

    if not (out / MANIFEST).is_file() or not any((out / f).is_file() for f in CONFIGS.values()):
        return
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
    write_card(
        out,
        license_=settings.export.conf.license,
        task_categories=settings.export.conf.task_categories,
        overrides=overrides,
    )
