"""What a research-QA run reads: the ``model`` and ``task`` schemas and :class:`ResearchQASettings`.

Takes: nothing (the types). Gives: :class:`ModelConf` with :class:`ModelParametersConf` (the
``model`` group) and :class:`ResearchQATaskConf` with :class:`ResearchQACheckConf` (the
``task`` group of ``task=research_qa``): the structured-config schemas Hydra validates, which
:mod:`storyforge.config.research_qa` registers, checks and seals; and
:class:`ResearchQASettings`, everything a run needs, built from the composed config by
:func:`storyforge.config.research_qa.check`.

Why here, in the task: the export and the Modelfile writer read these types, and the task
layer sits below the config layer, so the schemas of the task's own groups are the task's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge.engine.budget import Estimator
from storyforge.sealed import MISSING, Sealed
from storyforge.tasks.research_qa.format import PromptFormat
from storyforge.tasks.research_qa.modelfile import CHATML_TEMPLATE

__all__ = [
    "ModelConf",
    "ModelParametersConf",
    "ResearchQACheckConf",
    "ResearchQASettings",
    "ResearchQATaskConf",
]


@dataclass
class ModelParametersConf(Sealed):
    """Ollama PARAMETER lines written into the Modelfile, in this order."""

    temperature: float = 0.0
    top_p: float = 0.9
    repeat_penalty: float = 1.1
    num_ctx: int = 4096
    stop: list[str] = field(default_factory=lambda: ["<|im_end|>", "<|im_start|>"])


@dataclass
class ModelConf(Sealed):
    """A model under evaluation. ``model_type`` is required: base, instruction_only or rag_trained."""

    name: str = MISSING
    model_type: str = MISSING
    # Modelfile FROM: a GGUF path (relative to the Modelfile) or an Ollama model name
    gguf_path: str = MISSING
    # Modelfile TEMPLATE (Go template); the default is ChatML, the format SFT exports train with
    chat_template: str = CHATML_TEMPLATE
    parameters: ModelParametersConf = field(default_factory=ModelParametersConf)


@dataclass
class ResearchQACheckConf(Sealed):
    """What ``stage=check`` validates besides the prompt format itself."""

    # Modelfiles: "PATH" (model type from its "# storyforge:" header) or "MODEL_TYPE=PATH"
    modelfiles: list[str] = field(default_factory=list)
    # export folders (a condition folder, or any folder holding them)
    artifacts: list[str] = field(default_factory=list)


@dataclass
class ResearchQATaskConf(Sealed):
    """``task=research_qa``: exports, Modelfiles and drift checks from one prompt format."""

    kind: str = "research_qa"
    job: str = "storyforge.jobs.research_qa.run"
    # closed_book / with_context pick the model type's mode; or name a mode directly:
    # instruction, rag_standard, rag_stored, hybrid, rag_trained_no_context
    prompt_mode: str = "closed_book"
    # with_context on base / rag_trained: build the RAG prompt (generated) or send the
    # dataset's rag.prompt byte for byte (stored)
    rag_source: str = "generated"
    require_citations: bool = True
    extra_instructions: str | None = None
    # token estimator for the budget (cfg.budget.max_tokens): null = storyforge.engine.budget's
    # default, or {_target_: storyforge.engine.budget.tiktoken_estimator, path_or_name: ...}
    estimator: Any = None
    # write Modelfiles here (stage=modelfiles); null = the run directory
    modelfiles_dir: str | None = None
    # export only the first N records (null = all)
    limit: int | None = None
    progress: bool = True
    check: ResearchQACheckConf = field(default_factory=ResearchQACheckConf)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResearchQASettings:
    """Everything a research-QA run needs, checked (``model`` and ``task`` sealed)."""

    prompt_format: PromptFormat
    model: ModelConf
    model_type: str
    requested_mode: str
    prompt_mode: str
    task: ResearchQATaskConf
    budget: int | None
    estimator: Estimator | None
    estimator_name: str
    dataset: Path
    stage: str
    strict: bool
    config_sha256: str = ""
    # Pinned input files ({key: {path, sha256}}, see storyforge.config.inputs); empty when none.
    inputs: Mapping[str, Any] = field(default_factory=dict)
