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

__version__ = "0.1.0"
