"""Structured config of the drift gate: the ``drift`` group (``conf/drift/default.yaml``).

Takes: nothing; after composition, the ``drift`` node. Gives: :class:`DriftConf` (stored as
``drift/base_drift``) and :func:`drift_options`, which turns the node into the plain, frozen
:class:`~storyforge.drift.command.DriftOptions` the gate takes (paths made absolute against
the directory Hydra started in), or ``None`` when no tokenizer is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path

from storyforge.drift.command import DriftOptions
from storyforge.errors import ConfigError

__all__ = ["DriftConf", "drift_options", "register"]


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


def register(cs: ConfigStore) -> None:
    cs.store(group="drift", name="base_drift", node=DriftConf)


def drift_options(
    node: Any, *, exports: tuple[Path, ...] = (), report: Path | None = None
) -> DriftOptions | None:
    """The gate's options from the ``drift`` node plus the run's own ``exports``; ``None``
    when ``drift.tokenizer`` is not set. :class:`ConfigError` names the key at fault."""
    from storyforge.config.common import validate_node

    conf = validate_node(DriftConf, node, "drift") if node is not None else DriftConf()
    if conf.tokenizer is None:
        return None
    if conf.allow < 0:
        raise ConfigError(f"drift.allow must be >= 0, got {conf.allow}")
    if conf.server_prompts not in ("chat", "text"):
        raise ConfigError(f"drift.server_prompts must be chat or text, got {conf.server_prompts!r}")

    def absolute(path: str | None) -> str | None:
        return to_absolute_path(path) if path else None

    return DriftOptions(
        exports=(*(str(p) for p in exports), *(to_absolute_path(p) for p in conf.exports)),
        tokenizer=to_absolute_path(conf.tokenizer),
        server=conf.server,
        server_prompts=conf.server_prompts,
        server_each=conf.server_each,
        gguf=absolute(conf.gguf),
        openai=conf.openai,
        openai_model=conf.openai_model,
        modelfiles=tuple(to_absolute_path(p) for p in conf.modelfiles),
        client_system=conf.client_system,
        allow=conf.allow,
        report=str(report) if report else None,
    )
