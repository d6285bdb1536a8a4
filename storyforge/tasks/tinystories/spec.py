"""The TinyStories seed specification as data: themes, record fields and constraint bounds.

Takes: nothing. Gives: :data:`THEME_SET`, :data:`SEED_FIELDS` (the record's keys in their
canonical order), :class:`IntRange`, :class:`SeedConstraints` and :data:`SPEC_CONSTRAINTS`
(the bounds the seed specification fixes). Why: the generator, the seed validator, the
config check and the JSON Schema all state the same rules; this module is the one place
they read them from, so a configured constraint can only narrow what the spec allows.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SEED_FIELDS", "SPEC_CONSTRAINTS", "SPLITS", "THEME_SET", "IntRange", "SeedConstraints"]

THEME_SET: tuple[str, ...] = (
    "friendship",
    "kindness",
    "honesty",
    "courage",
    "curiosity",
    "sharing",
    "patience",
    "teamwork",
    "responsibility",
    "gratitude",
)
"""Allowed themes, in the order the seed specification lists them."""

SEED_FIELDS: tuple[str, ...] = (
    "id",
    "split",
    "protagonist",
    "theme",
    "required",
    "banned",
    "min_sentences",
    "max_sentences",
    "instruction",
)
"""Every key of a ``prompts_seed.jsonl`` record, in the order records are written."""

SPLITS: tuple[str, ...] = ("train", "val")


@dataclass(frozen=True, slots=True, kw_only=True)
class IntRange:
    """An inclusive integer range ``min..max``."""

    min: int
    max: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.min <= value <= self.max

    def within(self, outer: IntRange) -> bool:
        """True when every value of this range is also in ``outer``."""
        return outer.min <= self.min and self.max <= outer.max

    def __str__(self) -> str:
        return f"{self.min}..{self.max}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedConstraints:
    """Global constraints on a seed: default sentence range, phrase counts and lengths.

    ``min_sentences``/``max_sentences`` are the range given to generated seeds (a loaded
    seed carries its own); ``max_chars`` is the output length cap the seed's story must meet.
    """

    min_sentences: int = 6
    max_sentences: int = 9
    required_count: IntRange = IntRange(min=2, max=4)
    required_length: IntRange = IntRange(min=3, max=40)
    banned_count: IntRange = IntRange(min=0, max=2)
    banned_length: IntRange = IntRange(min=3, max=30)
    max_chars: int = 2000


SPEC_CONSTRAINTS = SeedConstraints()
"""The bounds of the seed specification; configured constraints must lie inside them."""
