"""The task-kind contract: what every task kind publishes to templates and the renderer.

Takes: nothing. Gives: :class:`TaskKind` and a small registry (:func:`register_task_kind`,
:func:`get_task_kind`, :func:`task_kind_names`). A task kind is one module (or package) in
``storyforge/tasks/`` that builds a :class:`TaskKind` and registers it at import time; adding
one needs no change to the renderer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from storyforge.engine.errors import did_you_mean
from storyforge.engine.sources import SourceRegistry, SourceSpec, SourceTable, field_registry

__all__ = [
    "TaskKind",
    "get_task_kind",
    "register_field_kind",
    "register_table_kind",
    "register_task_kind",
    "task_kind_names",
]

# Modules that define the built-in task kinds; imported on first lookup.
BUILTIN_TASK_MODULES: tuple[str, ...] = (
    "storyforge.tasks.tinystories",
    "storyforge.tasks.tinystories.repair",
    "storyforge.tasks.tinystories.judge",
    "storyforge.tasks.research_qa",
    "storyforge.tasks.turn_generation",
    "storyforge.tasks.chapter_summarization",
    "storyforge.tasks.writing_assistant",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskKind:
    """One task kind's data contract.

    ``context_type`` is the TypedDict (or dataclass) describing the render context;
    ``sources`` publishes every named source; ``registry_factory(ctx)`` returns the
    :class:`SourceRegistry` whose handlers read that context. ``check_args(source, args)``,
    when given, returns the problems with a DataRef's ``args`` (empty when they are fine);
    lint runs it on every DataRef and the handlers raise on the same problems at render time.
    ``data_expansion`` is how a ``{{path}}`` typed inside a string of the context renders:
    ``paths`` (default) expands it to a string, number or boolean (a mapping or list renders
    empty with a warning), ``off`` inserts data strings as they are.
    """

    name: str
    context_type: type
    sources: tuple[SourceSpec, ...]
    registry_factory: Callable[[Mapping[str, Any]], SourceRegistry]
    description: str = ""
    check_args: Callable[[str, Any], Sequence[str]] | None = None
    data_expansion: Literal["paths", "off"] = "paths"

    @property
    def allowed_sources(self) -> tuple[str, ...]:
        """Source names templates of this kind may reference (reserved ones are implied)."""
        return tuple(spec.name for spec in self.sources)

    def registry(self, ctx: Mapping[str, Any]) -> SourceRegistry:
        return self.registry_factory(ctx).with_data_expansion(self.data_expansion)


_KINDS: dict[str, TaskKind] = {}


def register_task_kind(kind: TaskKind) -> TaskKind:
    """Make ``kind`` findable by name (called by each task module at import time)."""
    _KINDS[kind.name] = kind
    return kind


def register_table_kind(name: str, context_type: type, table: SourceTable, description: str) -> TaskKind:
    """Register a kind whose sources, registry and argument checks are ``table``'s."""
    return register_task_kind(
        TaskKind(
            name=name,
            context_type=context_type,
            sources=table.specs,
            registry_factory=table.registry_for,
            description=description,
            check_args=table.check_args,
        )
    )


def register_field_kind(
    name: str, context_type: type, sources: tuple[SourceSpec, ...], description: str, *, required: bool
) -> TaskKind:
    """Register a kind whose every source gives the context field of the same name.

    Handlers read the context they are given, so one registry serves every context;
    ``required`` makes a missing field a render warning instead of ``None``.
    """
    registry = field_registry(sources, required=required)
    return register_task_kind(
        TaskKind(
            name=name,
            context_type=context_type,
            sources=sources,
            registry_factory=registry.registry_for,
            description=description,
        )
    )


def _load_builtins() -> None:
    for module in BUILTIN_TASK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real import error inside an existing module
                raise


def task_kind_names() -> tuple[str, ...]:
    _load_builtins()
    return tuple(sorted(_KINDS))


def get_task_kind(name: str) -> TaskKind:
    """The registered task kind called ``name``; a clear error with suggestions otherwise."""
    if name not in _KINDS:
        _load_builtins()
    try:
        return _KINDS[name]
    except KeyError:
        known = sorted(_KINDS)
        hint = did_you_mean(name, known)
        raise KeyError(f"unknown task kind {name!r}.{hint} Known: {', '.join(known)}") from None
