"""Named data sources: what a task kind offers to templates, and the handlers that supply it.

Takes: handler functions ``handler(ctx, args) -> value`` keyed by source name. Gives:
:class:`SourceRegistry` (an immutable name -> handler mapping handed to ``render``) and
:class:`SourceSpec` (a source's published contract: accepted args and output shape), which
drives source linting and the authoring docs of each task kind.

Reserved sources (``$item``, ``$index``, ``$parent``, ``$globals``, ``$ctx``) are resolved by
the renderer before this registry is consulted, so a handler registered under a reserved name
is never reached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["RESERVED_SOURCES", "Handler", "SourceRegistry", "SourceSpec"]

Handler = Callable[[Any, Any], Any]
"""``handler(ctx, args)``: ``args`` is the DataRef's ``args`` or ``None`` when it has none."""

RESERVED_SOURCES: frozenset[str] = frozenset({"$item", "$index", "$parent", "$globals", "$ctx"})


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSpec:
    """The published contract of one named source.

    ``args`` maps each accepted argument name to a short description of its type
    (``"int >= 1"``, ``"'asc' | 'desc'"``); ``returns`` describes the output shape
    (``"list[Turn]"``); ``description`` is one sentence for authors.
    """

    name: str
    returns: str
    args: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))


class SourceRegistry(Mapping[str, Handler]):
    """Immutable mapping of source name -> handler.

    ``SourceRegistry({"turns": lambda ctx, args: ctx["turns"]})``. A name without a handler
    resolves to ``None`` silently at render time; a handler that raises becomes a warning.
    """

    __slots__ = ("_handlers",)

    def __init__(self, handlers: Mapping[str, Handler] | None = None, /, **more: Handler) -> None:
        merged = dict(handlers or {})
        merged.update(more)
        for name, handler in merged.items():
            if not isinstance(name, str):
                raise TypeError(f"source names must be strings, got {name!r}")
            if not callable(handler):
                raise TypeError(f"handler for source {name!r} is not callable")
        self._handlers: Mapping[str, Handler] = MappingProxyType(merged)

    def __getitem__(self, name: str) -> Handler:
        return self._handlers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)

    def __repr__(self) -> str:
        return f"SourceRegistry({sorted(self._handlers)})"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._handlers)

    @property
    def handlers(self) -> Mapping[str, Handler]:
        """The read-only name -> handler mapping (what the renderer looks sources up in)."""
        return self._handlers

    def extend(self, handlers: Mapping[str, Handler] | None = None, /, **more: Handler) -> SourceRegistry:
        """A new registry with these handlers added (or replaced)."""
        merged = dict(self._handlers)
        merged.update(handlers or {})
        merged.update(more)
        return SourceRegistry(merged)
