"""storyforge: declarative, config-driven prompt engine.

Public API::

    import storyforge

    template = storyforge.load_template("conf/template/turn_writer.yaml")  # or a dict; task=...
    result = template.render(ctx, budget=2000)  # .messages, .warnings, .trace
    answers = storyforge.generate([result.messages], provider={"name": "openai", "model": "m"})
    storyforge.tinystories.draw_seeds(10)  # the TinyStories job from Python (storyforge.tinystories)

    from storyforge import compile_template, render, SourceRegistry, TemplateValidationError
"""

from __future__ import annotations

import importlib
from typing import Any

from storyforge.api import Answer, TaskTemplate, generate, load_template
from storyforge.engine import (
    MISSING,
    CompiledTemplate,
    ConfigError,
    Issue,
    RenderError,
    RenderLimitError,
    RenderResult,
    SourceRegistry,
    SourceSpec,
    StoryforgeError,
    TemplatePath,
    TemplateValidationError,
    compile_template,
    content_hash,
    render,
)
from storyforge.errors import DataError, ProviderError

__version__ = "0.1.0"

__all__ = [
    "MISSING",
    "Answer",
    "CompiledTemplate",
    "ConfigError",
    "DataError",
    "Issue",
    "ProviderError",
    "RenderError",
    "RenderLimitError",
    "RenderResult",
    "SourceRegistry",
    "SourceSpec",
    "StoryforgeError",
    "TaskTemplate",
    "TemplatePath",
    "TemplateValidationError",
    "compile_template",
    "content_hash",
    "generate",
    "load_template",
    "render",
]


def __getattr__(name: str) -> Any:
    """``storyforge.tinystories`` without ``import storyforge.tinystories`` (loaded on first use)."""
    if name == "tinystories":
        return importlib.import_module("storyforge.tinystories")
    raise AttributeError(f"module 'storyforge' has no attribute {name!r}")
