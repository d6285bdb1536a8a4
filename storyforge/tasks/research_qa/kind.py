"""The ``research_qa`` task kind: one question, its retrieved contexts, and the model's format.

Takes: nothing. Gives: :class:`ResearchQAContext` (the render context of every research-QA
template), :data:`SOURCES` and :data:`TASK`, registered under the name ``research_qa`` when
this module is imported. Why: research-QA templates (``conf/template/rqa_*.yaml``) may only
read what a record and the prompt format supply; publishing that as named sources lets the
linter reject a template that asks for anything else.
"""

from __future__ import annotations

from typing import TypedDict

from storyforge.engine.sources import SourceSpec
from storyforge.tasks.base import register_field_kind

__all__ = ["SOURCES", "TASK", "ResearchQAContext"]


class ResearchQAContext(TypedDict):
    """What one research-QA prompt is rendered from.

    ``contexts`` holds the snippets exactly as shown (``[1] …``), after numbering and after the
    token budget dropped any from the end; ``stored_prompt`` is the dataset's ``rag.prompt``.
    """

    task_id: str
    model_type: str
    prompt_mode: str
    system_message: str
    instruction: str
    contexts: list[str]
    context_separator: str
    stored_prompt: str | None
    require_citations: bool
    extra_instructions: str | None


SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec(
        name="system_message",
        returns="str",
        description="The model type's system message; the same in every mode of that model.",
    ),
    SourceSpec(name="instruction", returns="str", description="The question, trimmed."),
    SourceSpec(
        name="contexts",
        returns="list[str]",
        description="Numbered snippets as shown ('[1] …'), contiguous after the token budget.",
    ),
    SourceSpec(
        name="stored_prompt",
        returns="str | None",
        description="The dataset's rag.prompt, to be sent byte for byte (use it with 'from').",
    ),
)


TASK = register_field_kind(
    "research_qa",
    ResearchQAContext,
    SOURCES,
    "Research-paper questions with retrieved contexts, rendered per model type and mode.",
    required=False,
)
