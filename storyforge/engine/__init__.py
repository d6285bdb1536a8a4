"""The template engine: schema, grammar, parser, compiler, renderer, budget and trace.

Takes: template documents (mappings), contexts and a :class:`SourceRegistry`. Gives: compiled
templates and rendered chat messages. It depends on nothing else in storyforge: the task kinds,
jobs, providers, the template store and the command line build on it, never the reverse.
"""

from __future__ import annotations

from storyforge.engine.compiler import CompiledTemplate, compile_template, content_hash
from storyforge.engine.errors import (
    ConfigError,
    Issue,
    RenderError,
    RenderLimitError,
    StoryforgeError,
    TemplatePath,
    TemplateValidationError,
)
from storyforge.engine.renderer import RenderResult, render
from storyforge.engine.sources import MISSING, SourceRegistry, SourceSpec

__all__ = [
    "MISSING",
    "CompiledTemplate",
    "ConfigError",
    "Issue",
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
