"""The ``research_qa`` task kind: one prompt format for training exports, evaluation and Ollama.

Public names (the seed's names are kept for users migrating; each loads lazily)::

    system_message(model_type) -> str
    build_instruction_only_prompt(instruction, model_type="instruction_only") -> str
    build_rag_prompt(instruction, contexts, require_citations=True, extra_instructions=None) -> str
    build_hybrid_rag_prompt(instruction, contexts) -> str
    normalize_contexts(contexts) -> list[str]
    validate_modelfile_system_message(path, expected) -> list[str]
    validate_prompt_format_consistency(training_system_message, modelfile_system_message,
                                       evaluation_prompt, mode="instruction") -> list[str]
    validate_rag_prompt_no_system_text(prompt) -> list[str]

Importing the package registers the task kind (``storyforge.tasks.research_qa.kind``).
"""

from __future__ import annotations

from storyforge.tasks import lazy_exports
from storyforge.tasks.research_qa.kind import TASK as TASK

_EXPORTS = {
    "CONTEXT_SEPARATOR": "storyforge.tasks.research_qa.contexts",
    "normalize_contexts": "storyforge.tasks.research_qa.contexts",
    "prepare_contexts": "storyforge.tasks.research_qa.contexts",
    "MODEL_TYPES": "storyforge.tasks.research_qa.format",
    "MODES_BY_MODEL_TYPE": "storyforge.tasks.research_qa.format",
    "PROMPT_MODES": "storyforge.tasks.research_qa.format",
    "PromptFormat": "storyforge.tasks.research_qa.format",
    "default_prompt_format": "storyforge.tasks.research_qa.format",
    "load_prompt_format": "storyforge.tasks.research_qa.format",
    "normalize_model_type": "storyforge.tasks.research_qa.format",
    "resolve_prompt_mode": "storyforge.tasks.research_qa.format",
    "parse_modelfile": "storyforge.tasks.research_qa.modelfile",
    "read_modelfile": "storyforge.tasks.research_qa.modelfile",
    "render_modelfile": "storyforge.tasks.research_qa.modelfile",
    "PromptBuilder": "storyforge.tasks.research_qa.prompts",
    "PromptRequest": "storyforge.tasks.research_qa.prompts",
    "RenderedPrompt": "storyforge.tasks.research_qa.prompts",
    "build_hybrid_rag_prompt": "storyforge.tasks.research_qa.prompts",
    "build_instruction_only_prompt": "storyforge.tasks.research_qa.prompts",
    "build_rag_prompt": "storyforge.tasks.research_qa.prompts",
    "system_message": "storyforge.tasks.research_qa.prompts",
    "validate_modelfile_system_message": "storyforge.tasks.research_qa.validators",
    "validate_prompt_format_consistency": "storyforge.tasks.research_qa.validators",
    "validate_rag_prompt_no_system_text": "storyforge.tasks.research_qa.validators",
}

__all__ = [
    "CONTEXT_SEPARATOR",
    "MODEL_TYPES",
    "MODES_BY_MODEL_TYPE",
    "PROMPT_MODES",
    "TASK",
    "PromptBuilder",
    "PromptFormat",
    "PromptRequest",
    "RenderedPrompt",
    "build_hybrid_rag_prompt",
    "build_instruction_only_prompt",
    "build_rag_prompt",
    "default_prompt_format",
    "load_prompt_format",
    "normalize_contexts",
    "normalize_model_type",
    "parse_modelfile",
    "prepare_contexts",
    "read_modelfile",
    "render_modelfile",
    "resolve_prompt_mode",
    "system_message",
    "validate_modelfile_system_message",
    "validate_prompt_format_consistency",
    "validate_rag_prompt_no_system_text",
]
assert set(_EXPORTS) | {"TASK"} == set(__all__)

__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
