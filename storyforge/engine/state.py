"""Everything one render owns: context, handlers, budget manager, warnings and trace events.

Takes: the render context, the source handlers and a :class:`~storyforge.engine.budget.BudgetManager`.
Gives: :class:`RenderState`, which the compiled plan (:mod:`storyforge.engine.renderer`, phase A)
and the layout (:mod:`storyforge.engine.assembler`, phases B and C) run against, and
:data:`FAILED`, what a DataRef whose handler raised resolves to.

Why a module of its own: both render phases need it, and the layout phase must not import the
slot phase (the engine's imports point one way: compiler -> renderer -> assembler -> state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from storyforge.engine.budget import BudgetManager, default_estimator
from storyforge.engine.model import DataRef
from storyforge.engine.runtime import Scope, from_text, resolve_reserved
from storyforge.engine.sources import MISSING, RESERVED_SOURCES
from storyforge.engine.trace import RawEvent

__all__ = ["FAILED", "RenderState", "dropped_warning", "log", "text_from_value", "unresolvable_warning"]

log = logging.getLogger("storyforge.engine.renderer")
"""Render warnings go to the log at DEBUG level (the jobs and the command line show them)."""


class _Failed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "FAILED"


FAILED: Any = _Failed()
"""What :meth:`RenderState.resolve` returns when the source handler raised."""


def unresolvable_warning(ctx: Mapping[str, Any], ref_json: str, exc: BaseException) -> str:
    """The reference's warning: ``Unresolvable DataRef {...} in context with <keys> (<message>)``."""
    keys = ", ".join(map(str, ctx))
    return f"Unresolvable DataRef {ref_json} in context with {keys} ({exc})"


def text_from_value(value: Any, ref: DataRef, path: Any, warnings: list[str]) -> str:
    """The text ``from`` emits for a resolved, non-``None`` value (see :func:`from_text`).

    A mapping or list that cannot be written as JSON (it contains itself) emits nothing,
    with a warning in ``warnings`` (and the log); the reference fails the whole render
    instead (decision #23).
    """
    text = from_text(value)
    if not text and value.__class__ is not str and isinstance(value, (Mapping, list, tuple)):
        message = (
            f"{path}: {ref.to_json()} gave a value that contains itself (or is nested too deeply) "
            "and cannot be written as JSON; nothing was emitted"
        )
        warnings.append(message)
        log.debug("%s", message)
    return text


def dropped_warning(kind: str, path: Any, cost: int | None, max_tokens: int | None, consumed: int) -> str:
    """The warning for a layout message, header or footer that did not fit what the slots
    left (``cost=None``: the budget was used up before it); also logged at DEBUG level."""
    what = {"layout": "layout message", "header": "header", "footer": "footer"}.get(kind, kind)
    if cost is None:
        reason = f"the {max_tokens}-token budget was used up before it (slots are filled first)"
    else:
        left = max(0, (max_tokens or 0) - consumed)
        needs = f"{cost} token" + ("" if cost == 1 else "s")
        reason = f"it needs {needs} but only {left} of the {max_tokens}-token budget remained"
    message = f"{path}: {what} dropped: {reason}"
    log.debug("%s", message)
    return message


class RenderState:
    """Everything one render owns: never shared between renders or threads."""

    __slots__ = (
        "bm",
        "chars",
        "ctx",
        "default_estimator",
        "events",
        "handlers",
        "root",
        "slot",
        "visited",
        "warnings",
    )

    FAILED: Any = FAILED

    def __init__(self, ctx: Mapping[str, Any], handlers: Mapping[str, Any], bm: BudgetManager) -> None:
        self.ctx = ctx
        self.handlers = handlers
        self.bm = bm
        self.default_estimator = bm.estimate is default_estimator
        self.warnings: list[str] = []
        self.events: list[RawEvent] = []
        self.root = Scope(ctx)
        self.slot: str | None = None
        self.visited = 0  # forEach items visited so far (MAX_RENDER_ITEMS)
        self.chars = 0  # characters of the messages emitted so far (MAX_OUTPUT_CHARS)

    def resolve(self, ref: DataRef, scope: Scope) -> Any:
        """The value of ``ref`` in ``scope``: ``None`` when absent, :data:`FAILED` if the handler raised."""
        source = ref.source
        if source in RESERVED_SOURCES:
            return resolve_reserved(source, ref.args, scope)
        handler = self.handlers.get(source)
        if handler is None:
            return None
        try:
            value = handler(self.ctx, ref.args)
        except Exception as exc:  # noqa: BLE001 - any handler failure is a warning plus absent data (§6.1)
            self.warn_unresolvable(ref.to_json(), exc)
            return FAILED
        return None if value is MISSING else value  # a handler saying "nothing": as no handler

    def resolve_for_condition(self, ref: DataRef, scope: Scope) -> Any:
        """The value of ``ref`` for a condition: :data:`MISSING` when it is absent or failed.

        Conditions tell a missing value from ``null`` (§7, decision #20): ``eq null`` on an
        unknown source is false, ``neq null`` on an absent path is true.
        """
        source = ref.source
        if source in RESERVED_SOURCES:
            return resolve_reserved(source, ref.args, scope, MISSING)
        handler = self.handlers.get(source)
        if handler is None:
            return MISSING
        try:
            return handler(self.ctx, ref.args)
        except Exception as exc:  # noqa: BLE001 - as in resolve()
            self.warn_unresolvable(ref.to_json(), exc)
            return MISSING

    def resolver_for(self, scope: Scope) -> Callable[[str, Any], Any]:
        """``resolve(source, args)`` for conditions evaluated in ``scope``: :data:`MISSING` when
        the value is absent or the handler raised."""

        def resolve(source: str, args: Any) -> Any:
            if source in RESERVED_SOURCES:
                return resolve_reserved(source, args, scope, MISSING)
            handler = self.handlers.get(source)
            if handler is None:
                return MISSING
            try:
                return handler(self.ctx, args)
            except Exception as exc:  # noqa: BLE001 - as in resolve()
                ref = DataRef(source=source, args=args, has_args=args is not None)
                self.warn_unresolvable(ref.to_json(), exc)
                return MISSING

        return resolve

    def evaluate(self, condition: Any, scope: Scope) -> bool:
        """Evaluate a compiled :class:`~storyforge.engine.nodes.Condition` in ``scope``."""
        return bool(condition.evaluate(scope, self.resolver_for(scope)))

    def text_from(self, value: Any, ref: DataRef, path: Any) -> str:
        """The text ``from`` emits for a resolved, non-``None`` value (see :func:`from_text`).

        A mapping or list that cannot be written as JSON (it contains itself) emits nothing,
        with a warning; the reference fails the whole render instead (decision #23).
        """
        return text_from_value(value, ref, path, self.warnings)

    def warn_dropped(self, kind: str, path: Any, cost: int | None) -> None:
        """Warn that a layout message, header or footer did not fit what the slots left."""
        self.warnings.append(dropped_warning(kind, path, cost, self.bm.max_tokens, self.bm.consumed))

    def warn_unresolvable(self, ref_json: str, exc: BaseException) -> None:
        """The reference's warning: ``Unresolvable DataRef {...} in context with <keys> (<message>)``."""
        self.warnings.append(unresolvable_warning(self.ctx, ref_json, exc))
