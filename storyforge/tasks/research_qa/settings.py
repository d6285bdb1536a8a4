"""What a research-QA run reads, checked and frozen: :class:`ResearchQASettings` and its parts.

Takes: nothing (the types). Gives: :class:`ResearchQASettings` (built from the composed config
by :func:`storyforge.config.research_qa.check`), :class:`ModelSettings` with
:class:`ModelParameters`, and :class:`TaskOptions` with :class:`CheckOptions`.

Why here, in the task: the export and the Modelfile writer read these settings, and the task
layer sits below the config layer (which turns a composed config into them), so the types the
task consumes are the task's own, as :class:`~storyforge.tasks.tinystories.exports.ExportOptions`
is for TinyStories.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge.engine.budget import Estimator
from storyforge.tasks.research_qa.format import PromptFormat

__all__ = ["CheckOptions", "ModelParameters", "ModelSettings", "ResearchQASettings", "TaskOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelParameters:
    """Ollama PARAMETER lines written into the Modelfile, in this order."""

    temperature: float
    top_p: float
    repeat_penalty: float
    num_ctx: int
    stop: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """The model under evaluation (``model`` group)."""

    name: str
    model_type: str
    gguf_path: str
    chat_template: str
    parameters: ModelParameters


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckOptions:
    """What ``stage=check`` validates besides the prompt format itself."""

    modelfiles: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOptions:
    """The ``task`` group of ``task=research_qa``."""

    prompt_mode: str
    rag_source: str
    require_citations: bool
    extra_instructions: str | None
    modelfiles_dir: str | None
    limit: int | None
    progress: bool
    check: CheckOptions = CheckOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class ResearchQASettings:
    """Everything a research-QA run needs, checked."""

    prompt_format: PromptFormat
    model: ModelSettings
    model_type: str
    requested_mode: str
    prompt_mode: str
    task: TaskOptions
    budget: int | None
    estimator: Estimator | None
    estimator_name: str
    dataset: Path
    stage: str
    strict: bool
    config_sha256: str = ""
    # Pinned input files ({key: {path, sha256}}, see storyforge.config.inputs); empty when none.
    inputs: Mapping[str, Any] = field(default_factory=dict)
