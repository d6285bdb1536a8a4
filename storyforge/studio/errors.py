"""The studio's one error type, in a module of its own so every studio module can raise it.

Takes: nothing. Gives: :class:`StudioError` (re-exported by :mod:`storyforge.studio.api`).
Why apart: the run viewer (:mod:`storyforge.studio.runs`) raises it and the API holds a run
viewer; with the error here, neither module imports the other both ways.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["StudioError"]


class StudioError(Exception):
    """A request the studio refuses; ``status`` is the HTTP status, ``issues`` any problems."""

    def __init__(self, message: str, *, status: int = 400, issues: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.issues = list(issues)
