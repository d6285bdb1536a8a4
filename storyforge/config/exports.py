"""Structured config schemas for the 'exports' area (registered by storyforge.config).

Takes: nothing. Gives: :class:`ExportConf` (the ``export`` group: output checks and the
SFT / rejects / DPO exports written from completions) and :class:`DpoPairing`, stored as
``base_export``. Why: a typo in a key, or a pairing policy that does not exist, fails when
the config is composed, naming the key and the allowed values, not halfway through a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hydra.core.config_store import ConfigStore

__all__ = ["DpoPairing", "ExportConf", "register"]


class DpoPairing(Enum):
    """How a seed's passing and failing samples become DPO preference pairs.

    ``one_per_seed``: the lowest-numbered passing sample against the lowest-numbered failing
    one. ``one_per_label``: the lowest passing sample against, for each failure label in
    label order, the lowest failing sample carrying it (a sample already paired is not
    paired twice). ``all_pairs``: every passing sample against every failing one. Samples
    labelled ``other`` (empty, non-text, provider errors) are never paired. ``attempts``
    (with ``regenerate.max_attempts`` > 1): per chain, its passing attempt against the failed
    attempt just before it, under the original prompt.
    """

    one_per_seed = "one_per_seed"
    one_per_label = "one_per_label"
    all_pairs = "all_pairs"
    attempts = "attempts"


@dataclass
class ExportConf:
    """The ``export`` group: what the completion stage checks and writes."""

    # (The output length cap is constraints.max_chars, shared with the seeds.)
    dpo_pairing: DpoPairing = DpoPairing.one_per_seed
    # Draw the PNG plots of report/ (summary.json and summary.md are always written).
    plots: bool = True
    # How many line numbers per problem kind summary.json lists (all are in completion_errors.jsonl).
    max_listed_lines: int = 100


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="export", name="base_export", node=ExportConf)
