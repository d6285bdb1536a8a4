"""The ``tinystories`` task kind: a prompt seed is the render context.

Takes: nothing. Gives: :class:`SeedRecord` (one line of ``prompts_seed.jsonl``),
:data:`SOURCES` and :data:`TASK`, registered under the name ``tinystories`` when this module
is imported (``import storyforge.tasks.tinystories`` does that). Why: templates of this kind
may only read the seed's fields; publishing them as named sources lets the linter reject a
template that asks for anything else. Kept free of heavy imports so that looking the kind
up costs nothing.
"""

from __future__ import annotations

from typing import TypedDict

from storyforge.engine.sources import SourceSpec
from storyforge.tasks.base import register_field_kind

__all__ = ["SOURCES", "TASK", "ConstraintFields", "SeedRecord"]


class ConstraintFields(TypedDict):
    """A seed's constraint fields: what templates of this kind and its companions may read."""

    protagonist: str
    theme: str
    required: list[str]
    banned: list[str]
    min_sentences: int
    max_sentences: int


class SeedRecord(ConstraintFields):
    """One prompt seed, exactly the fields of the seed specification."""

    id: str
    split: str
    instruction: str


SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec(name="protagonist", returns="str", description="Who the story is about."),
    SourceSpec(name="theme", returns="str", description="The story's theme, one of THEME_SET."),
    SourceSpec(
        name="required",
        returns="list[str]",
        description="Phrases the story must contain (2..4, matched case-insensitively).",
    ),
    SourceSpec(
        name="banned",
        returns="list[str]",
        description="Phrases the story must not contain (0..2, matched case-insensitively).",
    ),
    SourceSpec(name="min_sentences", returns="int", description="Fewest sentences allowed."),
    SourceSpec(name="max_sentences", returns="int", description="Most sentences allowed."),
)


# A seed without a field makes its source a render warning.
TASK = register_field_kind(
    "tinystories",
    SeedRecord,
    SOURCES,
    "Children's stories under explicit constraints (TinyStories-style prompt seeds).",
    required=True,
)
