"""Settings of the ``regenerate`` node: ask again until an answer passes its checks.

Takes: the composed config's ``regenerate`` node (absent: the defaults, one attempt). Gives:
:class:`RegenerateConf`, the schema the node is checked against and the one type the
regeneration code takes (checked and sealed by :func:`regenerate_settings`). Why a typed
object: the regeneration modules never read a ``DictConfig``; they take this one, checked
once here with errors that name the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge.config.common import validate_node
from storyforge.errors import ConfigError
from storyforge.sealed import Sealed

__all__ = ["MAX_ATTEMPTS_LIMIT", "RegenerateConf", "regenerate_settings"]

MAX_ATTEMPTS_LIMIT = 20
"""The most attempts a chain may have (each attempt is a full round of requests)."""


@dataclass
class RegenerateConf(Sealed):
    """The ``regenerate`` node of ``conf/config.yaml``: how a failing sample is asked again
    (see :mod:`storyforge.jobs.regenerate`)."""

    # Attempts per sample in all (1: no regeneration).
    max_attempts: int = 1
    # true: the next attempt is a repair conversation (prompt, failed answer, repair turn);
    # false: the prompt is sent again with the next sampling seed.
    feedback: bool = True
    # The repair turn's template (null: the packaged conf/template/tinystories_repair.yaml).
    template: str | None = None

    @property
    def enabled(self) -> bool:
        return self.max_attempts > 1

    @property
    def template_file(self) -> Path | None:
        """``template`` as a path (``~`` expanded), or ``None`` for the packaged one."""
        return Path(self.template).expanduser() if self.template else None

    def check(self) -> None:
        """``max_attempts`` in 1..:data:`MAX_ATTEMPTS_LIMIT` and ``template`` a file;
        :class:`ConfigError` names the key."""
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ConfigError(
                f"regenerate.max_attempts must be 1..{MAX_ATTEMPTS_LIMIT} (1: no regeneration), got {self.max_attempts}"
            )
        template = self.template_file
        if template is not None and not template.is_file():
            raise ConfigError(f"regenerate.template: no such file {str(template)!r}")


def regenerate_settings(cfg: Any) -> RegenerateConf:
    """``cfg.regenerate`` checked and sealed (the defaults when the node is absent)."""
    node = cfg.get("regenerate") if hasattr(cfg, "get") else None
    conf = validate_node(RegenerateConf, node, "regenerate") if node is not None else RegenerateConf()
    conf.check()
    return conf.seal()
