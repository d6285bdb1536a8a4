"""The repair turn of a regeneration chain: what failed, rendered in words by the engine.

Takes: a seed record, the failed answer and its checks (:class:`SeedChecks`), and a
``tinystories_repair`` template (by default the packaged ``conf/template/tinystories_repair.yaml``).
Gives: :data:`REPAIR_TASK` (the ``tinystories_repair`` task kind: the seed's fields plus what
the checks found), :func:`repair_context` and :class:`RepairRenderer`, which renders the user
turn ``regenerate.feedback=true`` sends after the failed answer.

Why a template: the wording of a repair request is data a user tunes per model, never Python
string formatting; the sources expose the failure as plain values (counts, phrase lists,
flags), so the template decides how to say it, and text from the answer is never evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storyforge.engine.sources import SourceSpec
from storyforge.tasks.base import register_field_kind
from storyforge.tasks.tinystories.instruction import KindRenderer, one_user_turn, packaged_template_path
from storyforge.tasks.tinystories.kind import SOURCES as SEED_SOURCES
from storyforge.tasks.tinystories.kind import ConstraintFields
from storyforge.tasks.tinystories.validate import SeedChecks

__all__ = ["REPAIR_TASK", "RepairContext", "RepairRenderer", "packaged_repair_path", "repair_context"]

TEMPLATE_FILE = "template/tinystories_repair.yaml"


class RepairContext(ConstraintFields):
    """The render context of a repair turn: the seed's constraint fields and the findings."""

    empty: bool
    sentence_count: int
    wrong_sentence_count: bool
    missing: list[str]
    present: list[str]
    chars: int
    max_chars: int
    too_long: bool
    labels: list[str]
    attempt: int
    judge_rule: str
    judge_reason: str
    cut_off: bool
    finish_reason: str
    echo: str


SOURCES: tuple[SourceSpec, ...] = (
    *SEED_SOURCES,
    SourceSpec(name="empty", returns="bool", description="The answer held no text."),
    SourceSpec(name="sentence_count", returns="int", description="Sentences the answer has."),
    SourceSpec(
        name="wrong_sentence_count",
        returns="bool",
        description="The sentence count is outside min_sentences..max_sentences.",
    ),
    SourceSpec(name="missing", returns="list[str]", description="Required phrases the answer lacks."),
    SourceSpec(name="present", returns="list[str]", description="Banned phrases the answer contains."),
    SourceSpec(name="chars", returns="int", description="Characters in the answer."),
    SourceSpec(name="max_chars", returns="int", description="The length cap (constraints.max_chars)."),
    SourceSpec(name="too_long", returns="bool", description="The answer is over the length cap."),
    SourceSpec(name="labels", returns="list[str]", description="The failure labels, in label order."),
    SourceSpec(name="attempt", returns="int", description="The failed attempt's number (1 = first)."),
    SourceSpec(
        name="judge_rule", returns="str", description="The rule the judge said was broken ('' if none)."
    ),
    SourceSpec(
        name="judge_reason",
        returns="str",
        description="The judge's reason ('' if the judge did not fail it).",
    ),
    SourceSpec(
        name="cut_off",
        returns="bool",
        description="The answer was cut off at the completion cap (finish_reason 'length').",
    ),
    SourceSpec(
        name="finish_reason",
        returns="str",
        description="How the answer ended ('stop', 'length', ...; '' when not known).",
    ),
    SourceSpec(
        name="echo",
        returns="str",
        description="Why the answer is an echo of its prompt, quoting the span ('' if it is not).",
    ),
)

REPAIR_TASK = register_field_kind(
    "tinystories_repair",
    RepairContext,
    SOURCES,
    "The user turn asking again after a TinyStories answer failed its checks.",
    required=True,
)


def packaged_repair_path() -> Path:
    """Where the packaged repair template lives (``storyforge/_conf/`` or ``<repo>/conf/``)."""
    return packaged_template_path(TEMPLATE_FILE)


def repair_context(
    seed: Mapping[str, Any],
    checks: SeedChecks,
    output: object,
    labels: tuple[str, ...],
    *,
    attempt: int,
    judge_rule: str = "",
    judge_reason: str = "",
    finish_reason: str | None = None,
    echo: str = "",
) -> RepairContext:
    """What the checks found in ``output`` (a failed answer of ``seed``), as template sources."""
    from storyforge.tasks.tinystories.validate import count_sentences

    text = output if isinstance(output, str) else ""
    low = text.lower()
    count = count_sentences(text) if text.strip() else 0
    return RepairContext(
        protagonist=str(seed.get("protagonist", "")),
        theme=str(seed.get("theme", "")),
        required=list(checks.required),
        banned=list(checks.banned),
        min_sentences=checks.min_sentences,
        max_sentences=checks.max_sentences,
        empty=not text.strip(),
        sentence_count=count,
        wrong_sentence_count=bool(text.strip()) and not checks.min_sentences <= count <= checks.max_sentences,
        missing=[
            p for p, lower in zip(checks.required, checks.required_lower, strict=True) if lower not in low
        ]
        if text.strip()
        else [],
        present=[p for p, lower in zip(checks.banned, checks.banned_lower, strict=True) if lower in low],
        chars=len(text),
        max_chars=checks.max_chars,
        too_long=len(text) > checks.max_chars,
        labels=list(labels),
        attempt=attempt,
        judge_rule=judge_rule,
        judge_reason=judge_reason,
        cut_off=finish_reason == "length",
        finish_reason=finish_reason or "",
        echo=echo,
    )


class RepairRenderer(KindRenderer):
    """A compiled ``tinystories_repair`` template; calling it renders one repair turn's text."""

    __slots__ = ()
    KIND = REPAIR_TASK
    DEFAULT_FILE = TEMPLATE_FILE

    def __call__(self, context: RepairContext) -> str:
        return one_user_turn(self._render(self._compiled, context, self._registry), self.name)
