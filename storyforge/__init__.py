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


# The short API sits on top of the package (it reaches the task kinds, the providers and the
# pipeline), so the root, which everything imports, loads it on first use.
_FROM_API = frozenset({"Answer", "TaskTemplate", "generate", "load_template"})


def __getattr__(name: str) -> Any:
    """``load_template``, ``generate`` (and their types) and the ``tinystories`` module, loaded on first use."""
    if name in _FROM_API:
        value = getattr(importlib.import_module("storyforge.api"), name)
    elif name == "tinystories":
        value = importlib.import_module("storyforge.tinystories")
    else:
        raise AttributeError(f"module 'storyforge' has no attribute {name!r}")
    globals()[name] = value
    return value
