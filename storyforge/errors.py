"""Errors shared by every part of storyforge.

Takes: nothing. Gives: the whole exception tree. The engine's own errors (authoring issues,
render failures) live in :mod:`storyforge.engine.errors` and are re-exported here; the errors
of configs, data, the template store and the providers are defined here::

    StoryforgeError
     ├── TemplateValidationError   authoring problems; ``.issues`` lists every one found
     ├── RenderError               unexpected failure while rendering a compiled template
     │    └── RenderLimitError     a safety limit (recursion, nesting, output size) was hit
     ├── ConfigError               a composed Hydra config breaks a rule (names the key)
     ├── DataError                 bad input records (names the record id and the rule)
     ├── StoreError                a template store operation failed (unknown or taken id)
     └── ProviderError             a model server answered with a non-retryable error
"""

from __future__ import annotations

from storyforge.engine.errors import (
    ConfigError,
    Issue,
    RenderError,
    RenderLimitError,
    StoryforgeError,
    TemplatePath,
    TemplateValidationError,
    at_path,
)

__all__ = [
    "ConfigError",
    "DataError",
    "Issue",
    "ProviderError",
    "RenderError",
    "RenderLimitError",
    "StoreError",
    "StoryforgeError",
    "TemplatePath",
    "TemplateValidationError",
    "at_path",
]


class DataError(StoryforgeError):
    """Bad input data; the message names the record and the rule."""


class StoreError(StoryforgeError):
    """A template store operation failed: the id is unknown, or already taken on create."""


class ProviderError(StoryforgeError):
    """A model server gave a non-retryable answer; names the status and the server's text."""

    def __init__(self, message: str, *, status: int | None = None, body: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
