"""Structured config schema for the ``dedup`` group, and its conversion to typed settings.

Takes: nothing (schema) or the composed config (:func:`dedup_settings`). Gives:
:class:`DedupConf` (stored as ``dedup/base_dedup``) and :func:`dedup_settings`, which returns
the frozen :class:`~storyforge.quality.dedup.DedupSettings` and
:class:`~storyforge.quality.diversity.DiversitySettings` the quality modules take. Why: the
quality code never reads a config object; a bad key or value fails at start naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path
from omegaconf import ListConfig, OmegaConf

from storyforge.config.common import validate_node
from storyforge.errors import ConfigError
from storyforge.quality.dedup import DedupSettings
from storyforge.quality.diversity import DiversitySettings

__all__ = ["DedupConf", "DiversityConf", "dedup_settings", "register"]


@dataclass
class DiversityConf:
    """``dedup.diversity``: whether the variety figures are computed, how much of each group they read."""

    enabled: bool = True
    sample: int = 5000
    group_sample: int = 1000
    bleu_sample: int = 200
    bleu_seed: int = 0
    top_openings: int = 20
    top_ngrams: int = 10


@dataclass
class DedupConf:
    """The ``dedup`` group (``dedup=none`` sets ``enabled: false``)."""

    enabled: bool = True
    # Words per shingle and the Jaccard similarity from which two outputs are near-duplicates.
    shingle_words: int = 5
    threshold: float = 0.8
    num_perm: int = 128
    seed: int = 1
    # One earlier export (JSONL or Parquet) or a list of them: outputs they already hold are dropped.
    against: Any = None
    explain_shingles: int = 5
    diversity: DiversityConf = field(default_factory=DiversityConf)


def _paths(value: Any) -> tuple[Path, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else None
    if items is None or not all(isinstance(item, str) and item for item in items):
        raise ConfigError(f"dedup.against must be a path or a list of paths, got {value!r}")
    return tuple(Path(to_absolute_path(item)) for item in items)


def dedup_settings(cfg: Mapping[str, Any] | None) -> tuple[DedupSettings, DiversitySettings]:
    """The checked settings of ``cfg.dedup``.

    Every composed run config holds the group (``dedup: default``, on); a hand-built config
    without the node looks for no repeats (the diversity figures are still computed).
    """
    node = (cfg or {}).get("dedup")
    if node is None:
        return DedupSettings(enabled=False), DiversitySettings()
    against = node.get("against") if isinstance(node, Mapping) else None
    conf = validate_node(DedupConf, node, "dedup")
    div = conf.diversity
    return (
        DedupSettings(
            enabled=conf.enabled,
            shingle_words=conf.shingle_words,
            threshold=conf.threshold,
            num_perm=conf.num_perm,
            seed=conf.seed,
            against=_paths(against),
            explain_shingles=conf.explain_shingles,
        ),
        DiversitySettings(
            enabled=div.enabled,
            sample=div.sample,
            group_sample=div.group_sample,
            bleu_sample=div.bleu_sample,
            bleu_seed=div.bleu_seed,
            top_openings=div.top_openings,
            top_ngrams=div.top_ngrams,
        ),
    )


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="dedup", name="base_dedup", node=DedupConf)
