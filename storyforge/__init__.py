"""storyforge: declarative, config-driven prompt engine.

Public API::

    from storyforge import compile_template, render, SourceRegistry, TemplateValidationError
"""

from __future__ import annotations

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
    "TemplatePath",
    "TemplateValidationError",
    "compile_template",
    "content_hash",
    "render",
]
