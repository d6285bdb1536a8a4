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
     ├── ProviderError             a model server answered with a non-retryable error
     └── BudgetExceeded            provider.max_cost_usd reached (or the estimate is above it)
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
    closest,
    did_you_mean,
)

__all__ = [
    "EXIT_CODES",
    "BudgetExceeded",
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
    "closest",
    "did_you_mean",
    "exit_code",
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


class BudgetExceeded(StoryforgeError):
    """The run's spending reached ``provider.max_cost_usd`` (or its estimate is above it)."""


EXIT_CODES: dict[str, int] = {
    "config": 2,
    "data": 3,
    "server": 4,
    "budget": 5,
    "interrupted": 130,
}
"""Exit statuses of ``python run.py`` by the kind of error (docs/running.md lists them)."""


def exit_code(exc: BaseException) -> int:
    """The exit status for an error a user can cause: config 2, data 3, model server 4, else 1.

    A config error is a key or template to fix; a data error an input file or record (also a
    file that cannot be read or written); a server error is what the model server answered
    (or that it did not answer). Anything else storyforge raises on purpose is 1.
    """
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_CODES["interrupted"]
    if isinstance(exc, (ConfigError, TemplateValidationError)):
        return EXIT_CODES["config"]
    if isinstance(exc, (DataError, StoreError, RenderError, OSError)):
        return EXIT_CODES["data"]
    if isinstance(exc, ProviderError):
        return EXIT_CODES["server"]
    if isinstance(exc, BudgetExceeded):
        return EXIT_CODES["budget"]
    return 1
