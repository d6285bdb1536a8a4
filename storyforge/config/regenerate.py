"""Settings of the ``regenerate`` node: ask again until an answer passes its checks.

Takes: the composed config's ``regenerate`` node (absent: the defaults, one attempt). Gives:
:class:`RegenerateConf` (the schema the node is checked against) and
:class:`RegenerateSettings` (the frozen, typed settings the regeneration code takes), built
by :func:`regenerate_settings`. Why a typed object: the regeneration modules never read a
``DictConfig``; they take these settings, checked once here with errors that name the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge.config.common import validate_node
from storyforge.errors import ConfigError

__all__ = ["MAX_ATTEMPTS_LIMIT", "RegenerateConf", "RegenerateSettings", "regenerate_settings"]

MAX_ATTEMPTS_LIMIT = 20
"""The most attempts a chain may have (each attempt is a full round of requests)."""


@dataclass
class RegenerateConf:
    """The ``regenerate`` node of ``conf/config.yaml``."""

    # Attempts per sample in all (1: no regeneration).
    max_attempts: int = 1
    # true: the next attempt is a repair conversation (prompt, failed answer, repair turn);
    # false: the prompt is sent again with the next sampling seed.
    feedback: bool = True
    # The repair turn's template (null: the packaged conf/template/tinystories_repair.yaml).
    template: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RegenerateSettings:
    """How a failing sample is asked again (see :mod:`storyforge.jobs.regenerate`)."""

    max_attempts: int = 1
    feedback: bool = True
    template: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.max_attempts > 1


def regenerate_settings(cfg: Any) -> RegenerateSettings:
    """``cfg.regenerate`` checked: ``max_attempts`` in 1..:data:`MAX_ATTEMPTS_LIMIT`."""
    node = cfg.get("regenerate") if hasattr(cfg, "get") else None
    conf = validate_node(RegenerateConf, node, "regenerate") if node is not None else RegenerateConf()
    if not 1 <= conf.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise ConfigError(
            f"regenerate.max_attempts must be 1..{MAX_ATTEMPTS_LIMIT} (1: no regeneration), got {conf.max_attempts}"
        )
    template = Path(conf.template).expanduser() if conf.template else None
    if template is not None and not template.is_file():
        raise ConfigError(f"regenerate.template: no such file {str(template)!r}")
    return RegenerateSettings(max_attempts=conf.max_attempts, feedback=conf.feedback, template=template)
