"""storyforge: declarative, config-driven prompt engine.

Public API::

    from storyforge import compile_template, render, SourceRegistry, TemplateValidationError
"""

from __future__ import annotations

from storyforge.compiler import (
    CompiledTemplate as CompiledTemplate,
)
from storyforge.compiler import (
    compile_template as compile_template,
)
from storyforge.compiler import (
    content_hash as content_hash,
)
from storyforge.errors import (
    ConfigError as ConfigError,
)
from storyforge.errors import (
    DataError as DataError,
)
from storyforge.errors import (
    Issue as Issue,
)
from storyforge.errors import (
    ProviderError as ProviderError,
)
from storyforge.errors import (
    RenderError as RenderError,
)
from storyforge.errors import (
    RenderLimitError as RenderLimitError,
)
from storyforge.errors import (
    StoryforgeError as StoryforgeError,
)
from storyforge.errors import (
    TemplatePath as TemplatePath,
)
from storyforge.errors import (
    TemplateValidationError as TemplateValidationError,
)
from storyforge.renderer import RenderResult as RenderResult
from storyforge.renderer import render as render
from storyforge.sources import SourceRegistry as SourceRegistry
from storyforge.sources import SourceSpec as SourceSpec

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
