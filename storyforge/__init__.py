"""storyforge: declarative, config-driven prompt engine.

Public API::

    from storyforge import compile_template, render, SourceRegistry, TemplateValidationError
"""

from __future__ import annotations

from storyforge.errors import (
    ConfigError as ConfigError,
    DataError as DataError,
    Issue as Issue,
    ProviderError as ProviderError,
    RenderError as RenderError,
    RenderLimitError as RenderLimitError,
    StoryforgeError as StoryforgeError,
    TemplatePath as TemplatePath,
    TemplateValidationError as TemplateValidationError,
)
from storyforge.compiler import (
    CompiledTemplate as CompiledTemplate,
    compile_template as compile_template,
    content_hash as content_hash,
)
from storyforge.renderer import RenderResult as RenderResult, render as render
from storyforge.sources import SourceRegistry as SourceRegistry, SourceSpec as SourceSpec

__version__ = "0.1.0"

__all__ = [
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
