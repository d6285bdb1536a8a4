"""Structured config schemas for the 'exports' area (registered by storyforge.config).

Takes: nothing. Gives: :class:`ExportConf` (the ``export`` group: output checks and the
SFT / rejects / DPO exports written from completions) and :class:`DpoPairing`, stored as
``base_export``. Why: a typo in a key, or a pairing policy that does not exist, fails when
the config is composed, naming the key and the allowed values, not halfway through a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore

from storyforge.config.common import validate_node
from storyforge.errors import ConfigError
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.validate import ECHO_WORDS, MAX_CHARS

# The longest echo rule: past this, an answer could copy whole sentences of its prompt and pass.
MAX_ECHO = 64

__all__ = ["DpoPairing", "ExportConf", "export_options", "register"]


class DpoPairing(Enum):
    """How a seed's passing and failing samples become DPO preference pairs.

    ``one_per_seed``: the lowest-numbered passing sample against the lowest-numbered failing
    one. ``one_per_label``: the lowest passing sample against, for each failure label in
    label order, the lowest failing sample carrying it (a sample already paired is not
    paired twice). ``all_pairs``: every passing sample against every failing one. Samples
    labelled ``other`` (empty, non-text, provider errors) are never paired. ``attempts``
    (with ``regenerate.max_attempts`` > 1): per chain, its passing attempt against the failed
    attempt just before it, under the original prompt. ``judge_margin`` (with a judge): per
    seed, the answer the judge rated best against one it failed, with their ``score`` margin.
    """

    one_per_seed = "one_per_seed"
    one_per_label = "one_per_label"
    all_pairs = "all_pairs"
    attempts = "attempts"
    judge_margin = "judge_margin"


@dataclass
class ExportConf:
    """The ``export`` group: what the completion stage checks and writes."""

    # (The output length cap is constraints.max_chars, shared with the seeds.)
    dpo_pairing: DpoPairing = DpoPairing.one_per_seed
    # Draw the PNG plots of report/ (summary.json and summary.md are always written).
    plots: bool = True
    # How many line numbers per problem kind summary.json lists (all are in completion_errors.jsonl).
    max_listed_lines: int = 100
    # The dataset card's (RUN/README.md) license and task categories (Hugging Face identifiers).
    license: str = "other"
    task_categories: list[str] = field(default_factory=lambda: ["text-generation"])


def export_options(cfg: Mapping[str, Any] | None, *, max_tokens: int | None = None) -> ExportOptions:
    """Read ``cfg.export``, ``cfg.constraints.max_chars`` and ``.echo_words``, and ``cfg.strict``
    (``max_tokens``: the provider's completion cap, named when an answer is cut off).

    A missing node means its defaults; a bad value raises :class:`ConfigError` naming the key.
    """
    cfg = cfg if cfg is not None else {}
    export = cfg.get("export")
    conf = validate_node(ExportConf, export, "export") if export is not None else ExportConf()
    if conf.max_listed_lines < 0:
        raise ConfigError(f"export.max_listed_lines must be >= 0, got {conf.max_listed_lines}")
    constraints = cfg.get("constraints") or {}
    max_chars = constraints.get("max_chars", MAX_CHARS)
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 1:
        raise ConfigError(f"constraints.max_chars must be a positive integer, got {max_chars!r}")
    echo_words = constraints.get("echo_words", ECHO_WORDS)
    if not isinstance(echo_words, int) or isinstance(echo_words, bool) or not 0 <= echo_words <= MAX_ECHO:
        raise ConfigError(
            f"constraints.echo_words must be an integer from 0 (off) to {MAX_ECHO}, got {echo_words!r}"
        )
    return ExportOptions(
        max_chars=max_chars,
        echo_words=echo_words,
        max_tokens=max_tokens,
        dpo_pairing=conf.dpo_pairing.value,
        plots=conf.plots,
        max_listed_lines=conf.max_listed_lines,
        strict=bool(cfg.get("strict", False)),
        license=conf.license,
        task_categories=tuple(conf.task_categories),
    )


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="export", name="base_export", node=ExportConf)
