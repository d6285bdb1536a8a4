"""The studio's one error type, in a module of its own so every studio module can raise it.

Takes: nothing. Gives: :class:`StudioError` (re-exported by :mod:`storyforge.studio.api`) and
:func:`query_int`, a URL query's whole number or the error naming it.
Why apart: the run viewer (:mod:`storyforge.studio.runs`) raises it and the API holds a run
viewer; with the error here, neither module imports the other both ways.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["StudioError", "query_int"]


class StudioError(Exception):
    """A request the studio refuses; ``status`` is the HTTP status, ``issues`` any problems."""

    def __init__(self, message: str, *, status: int = 400, issues: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.issues = list(issues)


def query_int(query: Mapping[str, str], key: str, default: int | None = None) -> int:
    """The whole number ``query[key]`` (``default`` when empty or missing, if given); else a StudioError."""
    value = query.get(key, "")
    if value == "" and default is not None:
        return default
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise StudioError(f"{key}: expected a whole number, got {value!r}")
    return int(value)
