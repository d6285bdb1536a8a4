"""Structured config of the drift gate: the ``drift`` group (``conf/drift/default.yaml``).

Takes: nothing; after composition, the composed config. Gives: :class:`DriftConf` (the
schema, stored as ``drift/base_drift``, and the one type the gate takes: the run builds it
from the config, ``storyforge drift`` from its arguments), :func:`settings`, which the
run's :func:`~storyforge.config.settings.read_settings` calls (checked, paths made absolute
against the directory Hydra started in, sealed), and :func:`check_drift_stage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from storyforge.config.common import Sealed
from storyforge.errors import ConfigError

__all__ = ["DriftConf", "check_drift_stage", "register", "settings"]


@dataclass
class DriftConf(Sealed):
    """What the gate compares: exports, the training tokenizer and each serving side to use;
    see ``conf/drift/default.yaml``. ``tokenizer`` is ``None`` when the gate is off."""

    tokenizer: str | None = None
    server: str | None = None
    # chat: the server applies its template; text: the client sends the training template's text
    server_prompts: str = "chat"
    # send every example to /apply-template (no per-shape shortcut; see storyforge.drift.serving)
    server_each: bool = False
    gguf: str | None = None
    openai: str | None = None
    openai_model: str | None = None
    modelfiles: list[str] = field(default_factory=list)
    client_system: bool = False
    allow: int = 0
    exports: list[str] = field(default_factory=list)

    def check(self) -> None:
        """The rules between values the schema's types do not say; :class:`ConfigError` names the key."""
        if self.allow < 0:
            raise ConfigError(f"drift.allow must be >= 0, got {self.allow}")
        if self.server_prompts not in ("chat", "text"):
            raise ConfigError(f"drift.server_prompts must be chat or text, got {self.server_prompts!r}")

    @property
    def training_tokenizer(self) -> str:
        """``tokenizer``, which the gate needs (:class:`ConfigError` when it is not set)."""
        if not self.tokenizer:
            raise ConfigError("drift.tokenizer is not set (the folder of the model's tokenizer files)")
        return self.tokenizer


def register(cs: ConfigStore) -> None:
    cs.store(group="drift", name="base_drift", node=DriftConf)


def settings(cfg: DictConfig) -> DriftConf:
    """The ``drift`` group of ``cfg`` (defaults when absent); :class:`ConfigError` names the key."""
    from storyforge.config.common import validate_node

    node = cfg.get("drift")
    conf = validate_node(DriftConf, node, "drift") if node is not None else DriftConf()
    conf.check()

    def absolute(path: str | None) -> str | None:
        return to_absolute_path(path) if path else None

    return replace(
        conf,
        tokenizer=absolute(conf.tokenizer),
        gguf=absolute(conf.gguf),
        modelfiles=[to_absolute_path(p) for p in conf.modelfiles],
        exports=[to_absolute_path(p) for p in conf.exports],
    ).seal()


def check_drift_stage(settings: DriftConf, stage: str | None) -> None:
    """``stage=drift`` runs the train/serve gate, which reads the model's tokenizer."""
    if stage == "drift" and settings.tokenizer is None:
        raise ConfigError("stage=drift needs drift.tokenizer=DIR (the folder of the model's tokenizer files)")
