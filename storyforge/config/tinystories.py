"""Structured config schemas for the TinyStories job, and the check run right after composition.

Takes: the composed Hydra config. Gives: the schema dataclasses behind ``conf/task/
tinystories.yaml``, ``conf/themes/``, ``conf/constraints/`` and ``conf/pools/`` (stored as
``task/base_tinystories``, ``themes/base_themes``, ``constraints/base_constraints`` and
``pools/base_pools``), and :func:`check`, which re-validates those nodes, applies the
cross-field rules (``min_sentences <= max_sentences``, ranges inside the seed specification,
known themes, usable pools) and returns a frozen :class:`TinyStoriesSettings`.

Why: a typo such as ``constraints.min_sentnces=3`` must fail before any work starts, and so
must a config whose seeds could never be valid; every message names the key at fault.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path
from omegaconf import MISSING, DictConfig

from storyforge.config.common import BudgetConf, plain_data, validate_node, validate_run
from storyforge.errors import ConfigError, did_you_mean
from storyforge.tasks.tinystories.spec import SPEC_CONSTRAINTS, THEME_SET, IntRange, SeedConstraints

if TYPE_CHECKING:
    from storyforge.tasks.tinystories.seeds import SeedGenerator

__all__ = [
    "ConstraintsConf",
    "Pools",
    "PoolsConf",
    "RangeConf",
    "ThemesConf",
    "TinyStoriesSettings",
    "TinyStoriesTaskConf",
    "check",
    "register",
]

log = logging.getLogger(__name__)

# The shortest story sentence the length check leaves room for: a range of up to
# ``max_sentences`` must fit ``max_chars`` at this many characters per sentence.
MIN_CHARS_PER_SENTENCE = 40

# A pool entry: letters, digits and inner spaces; nothing that moves a sentence boundary
# or needs escaping inside a phrase list.
_POOL_ENTRY = re.compile(r"[A-Za-z0-9]+(?: [A-Za-z0-9]+)*")


@dataclass
class TinyStoriesTaskConf:
    """``conf/task/tinystories.yaml``."""

    kind: str = "tinystories"
    job: str = "storyforge.jobs.tinystories.run"
    # Seeds to generate (ignored when seeds_path is set).
    n_seeds: int = 1000
    # Share of ids that land in the val split (decided per id, stable as n_seeds grows).
    val_fraction: float = 0.1
    # Record ids are f"{id_prefix}-{index:06d}".
    id_prefix: str = "ts"
    # Prepended to every prompt as a system turn when set.
    system_message: str | None = None


@dataclass
class RangeConf:
    """An inclusive integer range."""

    min: int = MISSING
    max: int = MISSING


@dataclass
class ConstraintsConf:
    """Global seed constraints (seed specification defaults)."""

    min_sentences: int = 6
    max_sentences: int = 9
    required_count: RangeConf = field(default_factory=lambda: RangeConf(min=2, max=4))
    required_length: RangeConf = field(default_factory=lambda: RangeConf(min=3, max=40))
    banned_count: RangeConf = field(default_factory=lambda: RangeConf(min=0, max=2))
    banned_length: RangeConf = field(default_factory=lambda: RangeConf(min=3, max=30))
    max_chars: int = 2000
    # An answer repeating this many consecutive words of its prompt (instruction, system
    # message, repair turn) is an echo and fails (label other); 0 turns the check off.
    echo_words: int = 8


@dataclass
class ThemesConf:
    """Themes generated seeds draw from (a subset of the seed specification's THEME_SET)."""

    names: list[str] = MISSING


@dataclass
class PoolsConf:
    """Word pools for generated seeds."""

    protagonists: list[str] = MISSING
    objects: list[str] = MISSING
    banned: list[str] = MISSING


@dataclass(frozen=True, slots=True, kw_only=True)
class Pools:
    """Pool entries usable under the configured constraints, duplicates refused."""

    protagonists: tuple[str, ...]
    objects: tuple[str, ...]
    banned: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyStoriesSettings:
    """Everything the TinyStories job reads from the config, checked and frozen."""

    seed: int
    n_seeds: int
    val_fraction: float
    id_prefix: str
    system_message: str | None
    themes: tuple[str, ...]
    constraints: SeedConstraints
    pools: Pools
    max_tokens: int | None
    seeds_path: Path | None
    completions: Path | None
    strict: bool
    template: Any = None
    """The composed ``template`` group as plain data (interpolations resolved)."""

    def seed_generator(self) -> SeedGenerator:
        """The generator drawing this run's seeds from its pools, themes and constraints."""
        from storyforge.tasks.tinystories.seeds import SeedGenerator

        return SeedGenerator(
            seed=self.seed,
            themes=self.themes,
            constraints=self.constraints,
            protagonists=self.pools.protagonists,
            objects=self.pools.objects,
            banned=self.pools.banned,
            id_prefix=self.id_prefix,
            val_fraction=self.val_fraction,
        )


def check(cfg: DictConfig) -> TinyStoriesSettings:
    """Validate the TinyStories parts of ``cfg``; raise :class:`ConfigError` naming the key."""
    run = validate_run(cfg)
    task = validate_node(TinyStoriesTaskConf, cfg.task, "task")
    constraints_conf = validate_node(ConstraintsConf, cfg.constraints, "constraints")
    themes_conf = validate_node(ThemesConf, cfg.themes, "themes")
    pools_conf = validate_node(PoolsConf, cfg.pools, "pools")
    budget = validate_node(BudgetConf, cfg.budget, "budget") if "budget" in cfg else BudgetConf()

    if task.n_seeds < 1:
        raise ConfigError(f"task.n_seeds must be >= 1, got {task.n_seeds}")
    if not 0.0 <= task.val_fraction <= 1.0:
        raise ConfigError(f"task.val_fraction must be between 0 and 1, got {task.val_fraction}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", task.id_prefix):
        raise ConfigError(
            f"task.id_prefix must be letters, digits, '_', '.', ':' or '-', got {task.id_prefix!r}"
        )
    if task.system_message is not None and not task.system_message.strip():
        raise ConfigError("task.system_message must be null or non-empty text")
    if budget.max_tokens is not None and budget.max_tokens < 1:
        raise ConfigError(f"budget.max_tokens must be null or >= 1, got {budget.max_tokens}")

    constraints = _check_constraints(constraints_conf)
    return TinyStoriesSettings(
        seed=run.seed,
        n_seeds=task.n_seeds,
        val_fraction=task.val_fraction,
        id_prefix=task.id_prefix,
        system_message=task.system_message,
        themes=_check_themes(themes_conf),
        constraints=constraints,
        pools=_check_pools(pools_conf, constraints),
        max_tokens=budget.max_tokens,
        seeds_path=_existing_file("seeds_path", run.seeds_path),
        completions=_existing_file("completions", run.completions),
        strict=run.strict,
        template=plain_data(cfg.get("template")),
    )


def _check_constraints(conf: ConstraintsConf) -> SeedConstraints:
    if conf.min_sentences < 1:
        raise ConfigError(f"constraints.min_sentences must be >= 1, got {conf.min_sentences}")
    if conf.min_sentences > conf.max_sentences:
        raise ConfigError(
            f"constraints.min_sentences ({conf.min_sentences}) must be <= "
            f"constraints.max_sentences ({conf.max_sentences})"
        )
    ranges: dict[str, IntRange] = {}
    for key in ("required_count", "required_length", "banned_count", "banned_length"):
        conf_range: RangeConf = getattr(conf, key)
        rng = IntRange(min=conf_range.min, max=conf_range.max)
        if rng.min > rng.max:
            raise ConfigError(
                f"constraints.{key}.min ({rng.min}) must be <= constraints.{key}.max ({rng.max})"
            )
        spec: IntRange = getattr(SPEC_CONSTRAINTS, key)
        if not rng.within(spec):
            raise ConfigError(
                f"constraints.{key} is {rng} but the seed specification allows only {spec}; "
                "a configured range may narrow it, not widen it"
            )
        ranges[key] = rng
    if not 1 <= conf.max_chars <= SPEC_CONSTRAINTS.max_chars:
        raise ConfigError(
            f"constraints.max_chars must be between 1 and {SPEC_CONSTRAINTS.max_chars}, got {conf.max_chars}"
        )
    fits = conf.max_chars // MIN_CHARS_PER_SENTENCE
    if conf.max_sentences > fits:
        raise ConfigError(
            f"constraints.max_sentences ({conf.max_sentences}) does not fit constraints.max_chars "
            f"({conf.max_chars}): at {MIN_CHARS_PER_SENTENCE} characters a sentence, at most {fits} "
            "sentences fit; lower constraints.max_sentences"
        )
    return SeedConstraints(
        min_sentences=conf.min_sentences,
        max_sentences=conf.max_sentences,
        max_chars=conf.max_chars,
        **ranges,
    )


def _check_themes(conf: ThemesConf) -> tuple[str, ...]:
    if not conf.names:
        raise ConfigError("themes.names must list at least one theme")
    seen: set[str] = set()
    for i, name in enumerate(conf.names):
        if name not in THEME_SET:
            hint = did_you_mean(name, THEME_SET)
            raise ConfigError(
                f"themes.names[{i}]: unknown theme {name!r}.{hint} Allowed: {', '.join(THEME_SET)}"
            )
        if name in seen:
            raise ConfigError(f"themes.names[{i}]: theme {name!r} is listed twice")
        seen.add(name)
    return tuple(conf.names)


def _check_pools(conf: PoolsConf, constraints: SeedConstraints) -> Pools:
    lengths = {
        "protagonists": IntRange(min=1, max=120),
        "objects": constraints.required_length,
        "banned": constraints.banned_length,
    }
    needed = {
        "protagonists": 1,
        "objects": constraints.required_count.max,
        "banned": constraints.banned_count.max,
    }
    usable: dict[str, tuple[str, ...]] = {}
    for key, length in lengths.items():
        entries: list[str] = getattr(conf, key)
        seen: dict[str, int] = {}
        kept: list[str] = []
        for i, entry in enumerate(entries):
            if not _POOL_ENTRY.fullmatch(entry):
                raise ConfigError(
                    f"pools.{key}[{i}]: {entry!r} must be words of letters or digits separated by "
                    "single spaces (no punctuation)"
                )
            folded = entry.lower()
            if folded in seen:
                raise ConfigError(
                    f"pools.{key}[{i}]: {entry!r} repeats pools.{key}[{seen[folded]}] (case-insensitive)"
                )
            seen[folded] = i
            if len(entry) in length:
                kept.append(entry)
        if len(kept) < needed[key]:
            raise ConfigError(
                f"pools.{key} has {len(kept)} entries of length {length}; "
                f"at least {needed[key]} are needed under the configured constraints"
            )
        if len(kept) < len(entries):
            log.info("pools.%s: %d of %d entries fit length %s", key, len(kept), len(entries), length)
        usable[key] = tuple(kept)
    return Pools(**usable)


def _existing_file(key: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(to_absolute_path(value))
    if not path.is_file():
        raise ConfigError(f"{key}: no such file {value!r} (resolved to {path})")
    return path


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="task", name="base_tinystories", node=TinyStoriesTaskConf)
    cs.store(group="constraints", name="base_constraints", node=ConstraintsConf)
    cs.store(group="themes", name="base_themes", node=ThemesConf)
    cs.store(group="pools", name="base_pools", node=PoolsConf)
