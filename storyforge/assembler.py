"""Render phases B and C: place slot buffers in the layout, then squash same-role neighbours.

Takes: the layout of the frozen model, the slot buffers from phase A and the render state
(same budget manager, now with no local scopes). Gives: :func:`build_layout` (the layout
compiled to closures once per template), :func:`assemble` (phase B) and :func:`squash`
(phase C: the final ``{"role", "content"[, "prefix"]}`` dicts).

Why a phase of its own: layout messages, headers and footers are budgeted only after every
slot is filled, so they get whatever budget is left (reference-semantics.md §9.2, kept on
purpose). Slot buffers are inserted without being checked or charged again: they were paid
for in phase A. Squashing joins with a single newline; decision #2: the merged message is
prefilled (``prefix: True``) when any of its parts was.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from storyforge.errors import RenderLimitError, TemplatePath
from storyforge.model import LayoutMessage, LayoutSlot, MessageBlock, Template, static_text
from storyforge.runtime import to_text

if TYPE_CHECKING:
    from storyforge.renderer import RenderState

Emitted = tuple[str, str, bool]
"""An emitted message before squashing: ``(role, content, prefix)``."""

_ROLE = itemgetter(0)

__all__ = ["EMITTED", "MAX_OUTPUT_CHARS", "SKIP", "STOP", "Step", "assemble", "build_layout", "squash"]

STOP, SKIP, EMITTED = 0, 1, 2
"""Outcomes of emitting one layout block: stop the header/footer list, skip it, or emitted."""

MAX_OUTPUT_CHARS = 64 * 1024 * 1024
"""Largest total message text one render may produce (a safety limit, not a budget)."""

BlockExec = Callable[["RenderState", list[Emitted], str], int]
Step = Callable[["RenderState", dict[str, list[Emitted]], list[Emitted]], None]


def _block_exec(block: MessageBlock) -> BlockExec:
    """Emit one layout message, header or footer block (no item in scope, no frames)."""
    role = block.role
    prefix = block.prefix
    ref = block.from_
    leaf = block.leaf
    skip_empty = block.skip_if_empty_interpolation and leaf is not None and leaf.has_variables
    static = static_text(leaf)
    path = block.path

    def emit(st: RenderState, out: list[Emitted], kind: str) -> int:
        bm = st.bm
        gmax = bm.max_tokens
        if gmax is not None and bm.consumed >= gmax:
            st.events.append((kind, path, "out_of_budget", None, None, None, st.slot, role))
            return STOP
        if ref is not None:
            value = st.resolve(ref, st.root)
            if value is None or value is st.FAILED:
                reason = "empty" if value is None else "resolver_error"
                st.events.append((kind, path, reason, None, None, None, st.slot, role))
                return SKIP
            text = value if type(value) is str else to_text(value)
        elif static is not None:
            text = static
        elif leaf is not None:
            text, contentful = leaf.render(st.root)
            if skip_empty and not contentful:
                st.events.append((kind, path, "empty", None, None, None, st.slot, role))
                return SKIP
        else:
            st.events.append((kind, path, "empty", None, None, None, st.slot, role))
            return SKIP
        cost: int | None = None
        if gmax is not None:
            cost = bm.estimate(text)
            if not bm.fits(cost):
                st.events.append((kind, path, "over_budget", cost, text, None, st.slot, role))
                return STOP
        if not text:
            st.events.append((kind, path, "empty", None, None, None, st.slot, role))
            return SKIP
        if cost is not None:
            bm.spend(cost)
        out.append((role, text, prefix))
        st.events.append((kind, path, None, cost, text, None, st.slot, role))
        return EMITTED

    return emit


def _message_step(node: LayoutMessage) -> Step:
    emit = _block_exec(node)

    def step(st: RenderState, buffers: dict[str, list[Emitted]], out: list[Emitted]) -> None:
        emit(st, out, "layout")

    return step


def _slot_step(node: LayoutSlot) -> Step:
    name = node.name
    headers = tuple(_block_exec(b) for b in node.header)
    footers = tuple(_block_exec(b) for b in node.footer)
    omit = node.omit_if_empty
    path: TemplatePath = node.path

    def step(st: RenderState, buffers: dict[str, list[Emitted]], out: list[Emitted]) -> None:
        buffer = buffers.get(name, [])
        if not buffer and omit:
            st.events.append(("insert", path, "empty", None, None, None, name, None))
            return
        st.slot = name
        for emit in headers:
            if emit(st, out, "header") == STOP:
                break
        out.extend(buffer)
        st.events.append(("insert", path, None, len(buffer), None, None, name, None))
        for emit in footers:
            if emit(st, out, "footer") == STOP:
                break
        st.slot = None

    return step


def build_layout(template: Template) -> tuple[Step, ...]:
    """The layout compiled to steps, in layout order."""
    return tuple(
        _message_step(node) if isinstance(node, LayoutMessage) else _slot_step(node)
        for node in template.layout
    )


def assemble(st: RenderState, layout: tuple[Step, ...], buffers: dict[str, list[Emitted]]) -> list[Emitted]:
    """Phase B: the layout in order, with headers/footers budgeted against what is left."""
    out: list[Emitted] = []
    for step in layout:
        step(st, buffers, out)
    return out


def squash(messages: list[Emitted]) -> list[dict[str, Any]]:
    """Phase C: join neighbours of the same role with ``"\\n"``; prefix is the OR of the parts."""
    result: list[dict[str, Any]] = []
    total = 0
    for role, run in groupby(messages, key=_ROLE):
        parts = list(run)
        if len(parts) == 1:
            _, text, prefix = parts[0]
        else:
            text = "\n".join([p[1] for p in parts])
            prefix = any(p[2] for p in parts)
        total += len(text)
        result.append(
            {"role": role, "content": text, "prefix": True} if prefix else {"role": role, "content": text}
        )
    if total > MAX_OUTPUT_CHARS:
        raise RenderLimitError(
            f"the rendered messages hold {total} characters, above the limit of {MAX_OUTPUT_CHARS}"
        )
    return result
