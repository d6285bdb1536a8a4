"""Structured config of the drift gate: the ``drift`` group (``conf/drift/default.yaml``).

Takes: nothing; after composition, the composed config. Gives: :class:`DriftConf` (the
schema, stored as ``drift/base_drift``), :class:`DriftSettings` (checked, frozen, paths made
absolute against the directory Hydra started in) and :func:`settings`, which the run's
:func:`~storyforge.config.settings.read_settings` calls; :func:`check_drift_stage`. The gate itself
(:mod:`storyforge.drift`) takes plain options built from these settings by the jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from storyforge.errors import ConfigError

__all__ = ["DriftConf", "DriftSettings", "check_drift_stage", "register", "settings"]


@dataclass
class DriftConf:
    """What the gate compares; see ``conf/drift/default.yaml``."""

    tokenizer: str | None = None
    server: str | None = None
    server_prompts: str = "chat"
    server_each: bool = False
    gguf: str | None = None
    openai: str | None = None
    openai_model: str | None = None
    modelfiles: list[str] = field(default_factory=list)
    client_system: bool = False
    allow: int = 0
    exports: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftSettings:
    """The ``drift`` group, checked; ``tokenizer`` is ``None`` when the gate is off."""

    tokenizer: str | None = None
    server: str | None = None
    server_prompts: str = "chat"
    server_each: bool = False
    gguf: str | None = None
    openai: str | None = None
    openai_model: str | None = None
    modelfiles: tuple[str, ...] = ()
    client_system: bool = False
    allow: int = 0
    exports: tuple[str, ...] = ()


def register(cs: ConfigStore) -> None:
    cs.store(group="drift", name="base_drift", node=DriftConf)


def settings(cfg: DictConfig) -> DriftSettings:
    """The ``drift`` group of ``cfg`` (defaults when absent); :class:`ConfigError` names the key."""
    from storyforge.config.common import validate_node

    node = cfg.get("drift")
    conf = validate_node(DriftConf, node, "drift") if node is not None else DriftConf()
    if conf.allow < 0:
        raise ConfigError(f"drift.allow must be >= 0, got {conf.allow}")
    if conf.server_prompts not in ("chat", "text"):
        raise ConfigError(f"drift.server_prompts must be chat or text, got {conf.server_prompts!r}")

    def absolute(path: str | None) -> str | None:
        return to_absolute_path(path) if path else None

    return DriftSettings(
        tokenizer=absolute(conf.tokenizer),
        server=conf.server,
        server_prompts=conf.server_prompts,
        server_each=conf.server_each,
        gguf=absolute(conf.gguf),
        openai=conf.openai,
        openai_model=conf.openai_model,
        modelfiles=tuple(to_absolute_path(p) for p in conf.modelfiles),
        client_system=conf.client_system,
        allow=conf.allow,
        exports=tuple(to_absolute_path(p) for p in conf.exports),
    )


def check_drift_stage(settings: DriftSettings, stage: str | None) -> None:
    """``stage=drift`` runs the train/serve gate, which reads the model's tokenizer."""
    if stage == "drift" and settings.tokenizer is None:
        raise ConfigError("stage=drift needs drift.tokenizer=DIR (the folder of the model's tokenizer files)")
