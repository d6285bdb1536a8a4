"""The render trace: what happened to every slot and node of one render, and why.

Takes: the raw events the renderer and assembler record while rendering (cheap tuples: no
strings are built and no tokens are counted unless the trace is read). Gives:
:class:`RenderTrace` with :attr:`~RenderTrace.events` (:class:`TraceEvent` values),
:attr:`~RenderTrace.slots` (one :class:`SlotTrace` per slot, in fill order),
:meth:`~RenderTrace.to_dict` (JSON-able, for tools and a playground page) and
:meth:`~RenderTrace.format` (the text behind ``storyforge render --explain``).

Why: rendering is forgiving (missing data, resolver errors and budget cuts skip output rather
than fail), so the trace is how an author sees what was skipped and the reason.

Statuses are ``rendered``, ``skipped`` and, for control nodes, ``ran``. Skip reasons:
``condition_false``, ``over_budget`` (did not fit the global, slot or node budget),
``out_of_budget`` (the global budget was already used up), ``empty`` (nothing to emit),
``resolver_error`` (a source handler raised; see ``result.warnings``), ``not_a_list`` (a
forEach source that is not a list). A loop stops walking its items once none can fit any
more (one ``out_of_budget`` event at the first item not visited), and items surely too long
for what is left are passed over without being rendered (one ``over_budget`` event at the
first of them, whose ``detail`` says how many).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from storyforge.engine.errors import TemplatePath

__all__ = [
    "REASONS",
    "RawEvent",
    "RenderTrace",
    "SlotInfo",
    "SlotTrace",
    "TraceEvent",
]

_CONTROL = frozenset({"slot", "forEach", "if", "insert"})
_EMITS = frozenset({"message", "separator", "layout", "header", "footer"})

REASONS = ("condition_false", "over_budget", "out_of_budget", "empty", "resolver_error", "not_a_list")

RawEvent = tuple[str, TemplatePath, "str | None", "int | None", "str | None", Any, "str | None", "str | None"]
"""``(kind, path, reason, cost, text, scope, slot, role)``; ``reason=None`` means rendered.

``kind`` is ``slot``, ``message``, ``forEach``, ``if``, ``separator``, ``layout``, ``header``,
``footer`` or ``insert`` (a slot buffer placed by the layout). For emitted text, ``cost`` may
be ``None`` when the budget never needed it (it is then estimated from ``text`` on demand);
for control nodes ``cost`` is a count (forEach items, inserted messages) and ``text`` a note
(``then``/``else``). ``scope`` is the runtime
scope the node ran in (its loop frames give the item indices), ``(enclosing scope, index)``
for a loop item that needed no scope of its own, or ``None``.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEvent:
    """One node's outcome in one render."""

    kind: str
    path: TemplatePath
    status: str
    reason: str | None
    tokens: int
    slot: str | None = None
    loop: tuple[int, ...] = ()
    role: str | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "status": self.status,
            "reason": self.reason,
            "tokens": self.tokens,
            "slot": self.slot,
            "loop": list(self.loop),
            "role": self.role,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotTrace:
    """One slot: whether it ran, why not, and what it produced."""

    name: str
    priority: int
    status: str
    reason: str | None
    messages: int
    tokens: int
    in_layout: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "priority": self.priority,
            "status": self.status,
            "reason": self.reason,
            "messages": self.messages,
            "tokens": self.tokens,
            "in_layout": self.in_layout,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotInfo:
    """What the trace needs to know about a slot before the render starts."""

    name: str
    priority: int
    in_layout: bool


class RenderTrace:
    """Everything recorded during one render; derived views are computed on first access.

    Recording is a list append of a tuple per node; :attr:`events`, :attr:`slots`,
    :meth:`to_dict` and :meth:`format` build objects and strings only when read.
    """

    __slots__ = ("_consumed", "_events", "_slots", "budget", "estimator", "raw", "slot_info", "template")

    def __init__(
        self,
        *,
        raw: list[RawEvent] | tuple[RawEvent, ...],
        estimator: Callable[[str], int],
        budget: int | None,
        consumed: int | None = None,
        slot_info: tuple[SlotInfo, ...] = (),
        template: str = "",
    ) -> None:
        self.raw = list(raw)
        self.estimator = estimator
        self.budget = budget
        self._consumed = consumed
        self.slot_info = slot_info
        self.template = template
        self._events: tuple[TraceEvent, ...] | None = None
        self._slots: tuple[SlotTrace, ...] | None = None

    def __repr__(self) -> str:
        return f"RenderTrace(template={self.template!r}, events={len(self.raw)}, consumed={self.consumed})"

    @property
    def consumed(self) -> int:
        """Tokens emitted: every rendered message, separator, layout message, header and footer.

        With a budget this is the budget manager's count; without one the render never needed
        to count, so the tokens are counted here from the emitted texts.
        """
        if self._consumed is None:
            self._consumed = sum(e.tokens for e in self.events if e.status == "rendered" and e.kind in _EMITS)
        return self._consumed

    @property
    def events(self) -> tuple[TraceEvent, ...]:
        """Every recorded node outcome, in the order it happened."""
        if self._events is None:
            self._events = self._build_events()
        return self._events

    @property
    def slots(self) -> tuple[SlotTrace, ...]:
        """One entry per slot in fill (priority) order."""
        if self._slots is None:
            self._slots = self._build_slots()
        return self._slots

    def _build_events(self) -> tuple[TraceEvent, ...]:
        out: list[TraceEvent] = []
        for kind, path, reason, cost, text, scope, slot, role in self.raw:
            detail: str | None = None
            tokens = 0
            if kind in _CONTROL:
                status = "ran" if reason is None else "skipped"
                detail = text
                if cost is not None:
                    unit = "messages" if kind == "insert" else "items"
                    detail = f"{cost} {unit[:-1] if cost == 1 else unit}"
            else:
                status = "rendered" if reason is None else "skipped"
                if reason is None:
                    tokens = cost if cost is not None else (self.estimator(text) if text else 0)
                elif cost is None and text is not None:
                    detail = text  # a note about several items, recorded as one event
            out.append(
                TraceEvent(
                    kind=kind,
                    path=path,
                    status=status,
                    reason=reason,
                    tokens=tokens,
                    slot=slot,
                    loop=_loop_indices(scope),
                    role=role,
                    detail=detail,
                )
            )
        return tuple(out)

    def _build_slots(self) -> tuple[SlotTrace, ...]:
        totals: dict[str, list[int]] = {info.name: [0, 0] for info in self.slot_info}
        verdict: dict[str, str | None] = {}
        for event in self.events:
            if event.slot is None:
                continue
            if event.kind == "slot":
                verdict[event.slot] = event.reason
            elif event.kind in ("message", "separator") and event.status == "rendered":
                t = totals.setdefault(event.slot, [0, 0])
                t[0] += 1
                t[1] += event.tokens
        out = []
        for info in self.slot_info:
            reason = verdict.get(info.name)
            messages, tokens = totals.get(info.name, [0, 0])
            if reason is None and messages == 0:
                reason = "empty"
            out.append(
                SlotTrace(
                    name=info.name,
                    priority=info.priority,
                    status="rendered" if reason is None else "skipped",
                    reason=reason,
                    messages=messages,
                    tokens=tokens,
                    in_layout=info.in_layout,
                )
            )
        return tuple(out)

    @property
    def skipped(self) -> tuple[TraceEvent, ...]:
        """Events whose node produced nothing, with their reasons."""
        return tuple(e for e in self.events if e.status == "skipped")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: budget totals, per-slot summary and every event."""
        return {
            "template": self.template,
            "budget": {"max_tokens": self.budget, "consumed": self.consumed},
            "slots": [s.to_dict() for s in self.slots],
            "events": [e.to_dict() for e in self.events],
        }

    def format(self) -> str:
        """Human-readable account of the render (``storyforge render --explain``)."""
        lines: list[str] = []
        limit = "unlimited" if self.budget is None else f"{self.budget} tokens"
        title = f"template {self.template!r}: " if self.template else ""
        emitted = sum(e.tokens for e in self.events if e.status == "rendered")
        lines.append(f"{title}{emitted} tokens emitted, budget {limit}")
        lines.append("slots, in fill order:")
        for s in self.slots:
            where = "" if s.in_layout else " (not in the layout)"
            state = "rendered" if s.reason is None else f"skipped: {s.reason}"
            lines.append(
                f"  {s.name} (priority {s.priority}){where}: {state}, "
                f"{s.messages} message{'s' if s.messages != 1 else ''}, {s.tokens} tokens"
            )
        lines.append("nodes:")
        for e in self.events:
            if e.kind == "slot":
                continue
            loop = "".join(f"[{i}]" for i in e.loop)
            item = f" item {loop}" if loop else ""
            if e.status == "rendered":
                state = f"rendered, {e.tokens} tokens"
            elif e.status == "ran":
                state = "ran" + (f" ({e.detail})" if e.detail else "")
            else:
                state = f"skipped: {e.reason}" + (f" ({e.detail})" if e.detail else "")
            lines.append(f"  {e.kind:<9} {e.path}{item}: {state}")
        return "\n".join(lines)


def _loop_indices(scope: Any) -> tuple[int, ...]:
    if isinstance(scope, tuple):  # (enclosing scope, index): a loop item rendered without a scope
        outer, index = scope
        return (*_loop_indices(outer), index)
    frames = getattr(scope, "frames", None) if scope is not None else None
    if not frames:
        return ()
    out = []
    for frame in frames:
        index = getattr(frame, "index", None)
        if isinstance(index, int):
            out.append(index)
    return tuple(out)
