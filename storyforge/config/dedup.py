"""Structured config of the ``dedup`` group: the schema stored, and the run's checked settings.

Takes: nothing (:func:`register`) or the composed config (:func:`dedup_settings`). Gives:
:func:`register`, which stores :class:`~storyforge.quality.dedup.DedupConf` (with its
:class:`~storyforge.quality.diversity.DiversityConf`) as ``dedup/base_dedup``, and
:func:`dedup_settings`, which returns that one type checked, ``against`` made absolute
against the directory Hydra started in, and sealed. Why: the quality code never reads a
config object; a bad key or value fails at start naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path

from storyforge.config.common import validate_node
from storyforge.quality.dedup import DedupConf
from storyforge.quality.diversity import DiversityConf

__all__ = ["DedupConf", "DiversityConf", "dedup_settings", "register"]


def dedup_settings(cfg: Mapping[str, Any] | None) -> DedupConf:
    """The checked, sealed ``cfg.dedup``.

    Every composed run config holds the group (``dedup: default``, on); a hand-built config
    without the node looks for no repeats (the diversity figures are still computed).
    """
    node = (cfg or {}).get("dedup")
    if node is None:
        return DedupConf(enabled=False).seal()
    conf = validate_node(DedupConf, node, "dedup")
    against = tuple(Path(to_absolute_path(str(path))) for path in conf.against_files)
    conf = replace(conf, against=against)
    conf.check()
    return conf.seal()


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="dedup", name="base_dedup", node=DedupConf)
