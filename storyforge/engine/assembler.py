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
from typing import Any

from storyforge.engine.errors import RenderLimitError, TemplatePath
from storyforge.engine.model import LayoutMessage, LayoutSlot, MessageBlock, Template, static_text
from storyforge.engine.runtime import (
    MAX_OUTPUT_CHARS,
    too_much_output,
)
from storyforge.engine.state import RenderState

Emitted = tuple[str, str, bool]
"""An emitted message before squashing: ``(role, content, prefix)``."""


__all__ = [
    "EMITTED",
    "MAX_OUTPUT_CHARS",
    "SKIP",
    "STOP",
    "LayoutStep",
    "Step",
    "assemble",
    "build_layout",
    "squash",
]

STOP, SKIP, EMITTED = 0, 1, 2
"""Outcomes of emitting one layout block: stop the header/footer list, skip it, or emitted."""


BlockExec = Callable[["RenderState", list[Emitted], str], int]
Step = Callable[["RenderState", dict[str, list[Emitted]], list[Emitted]], None]


def _too_much_at(total: int, path: TemplatePath) -> None:
    """Raise the ``MAX_OUTPUT_CHARS`` error at the node that passed it."""
    try:
        too_much_output(total)
    except RenderLimitError as exc:
        raise exc.at(path) from None


def _block_exec(block: MessageBlock) -> BlockExec:
    """Emit one layout message, header or footer block (no item in scope, no frames)."""
    role = block.role
    prefix = block.prefix
    ref = block.from_
    leaf = block.leaf
    skip_empty = block.skip_if_empty_interpolation and leaf is not None and leaf.has_variables
    static = static_text(leaf)
    path = block.path
    # fixed layout text is the template's own (bounded by its size): not counted
    counted = ref is not None or static is None

    def emit(st: RenderState, out: list[Emitted], kind: str) -> int:
        bm = st.bm
        gmax = bm.max_tokens
        if gmax is not None and bm.consumed >= gmax:
            st.events.append((kind, path, "out_of_budget", None, None, None, st.slot, role))
            st.warn_dropped(kind, path, None)
            return STOP
        if ref is not None:
            value = st.resolve(ref, st.root)
            if value is None or value is st.FAILED:
                reason = "empty" if value is None else "resolver_error"
                st.events.append((kind, path, reason, None, None, None, st.slot, role))
                return SKIP
            text = value if type(value) is str else st.text_from(value, ref, path)
        elif static is not None:
            text = static
        elif leaf is not None:
            try:
                text, contentful = leaf.render(st.root)
            except RenderLimitError as exc:
                raise exc.at(path) from None
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
                st.warn_dropped(kind, path, cost)
                return STOP
        if not text:
            st.events.append((kind, path, "empty", None, None, None, st.slot, role))
            return SKIP
        if cost is not None:
            bm.spend(cost)
        if counted:
            st.chars += len(text)
            if st.chars > MAX_OUTPUT_CHARS:
                _too_much_at(st.chars, path)
        out.append((role, text, prefix))
        st.events.append((kind, path, None, cost, text, None, st.slot, role))
        return EMITTED

    return emit


LayoutStep = tuple[int, Any]
"""``(kind, payload)``: a static layout message (kind 0), any other layout message (1), a slot (2)."""


def _layout_step(node: LayoutMessage | LayoutSlot) -> LayoutStep:
    if isinstance(node, LayoutSlot):
        return (2, _slot_step(node))
    text = static_text(node.leaf) if node.from_ is None else None
    if text:
        return (0, (node.role, text, node.prefix, node.path))  # fixed text: emitted by assemble()
    return (1, _block_exec(node))


def _slot_step(node: LayoutSlot) -> Step:
    name = node.name
    # The header and footer blocks are built the first time the slot is inserted (a slot left
    # out as empty never needs them); ``built`` holds them then: [(headers, footers)].
    built: list[tuple[tuple[BlockExec, ...], tuple[BlockExec, ...]] | None] = [
        None if node.header or node.footer else ((), ())
    ]
    omit = node.omit_if_empty
    path: TemplatePath = node.path

    def step(st: RenderState, buffers: dict[str, list[Emitted]], out: list[Emitted]) -> None:
        buffer = buffers.get(name, [])
        if not buffer and omit:
            st.events.append(("insert", path, "empty", None, None, None, name, None))
            return
        blocks = built[0]
        if blocks is None:
            blocks = built[0] = (
                tuple([_block_exec(b) for b in node.header]),
                tuple([_block_exec(b) for b in node.footer]),
            )
        headers, footers = blocks
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


def build_layout(template: Template) -> tuple[LayoutStep, ...]:
    """The layout compiled to steps, in layout order."""
    return tuple(_layout_step(node) for node in template.layout)


def assemble(
    st: RenderState, layout: tuple[LayoutStep, ...], buffers: dict[str, list[Emitted]]
) -> list[Emitted]:
    """Phase B: the layout in order, with headers/footers budgeted against what is left."""
    out: list[Emitted] = []
    bm = st.bm
    events = st.events
    for kind, payload in layout:
        if kind == 2:
            payload(st, buffers, out)
        elif kind == 1:
            payload(st, out, "layout")
        else:  # the emit step of §9.2 for a fixed text, inline
            role, text, prefix, path = payload
            gmax = bm.max_tokens
            if gmax is None:  # fixed layout text is the template's own: not counted
                out.append((role, text, prefix))
                events.append(("layout", path, None, None, text, None, None, role))
                continue
            if bm.consumed >= gmax:
                events.append(("layout", path, "out_of_budget", None, None, None, None, role))
                st.warn_dropped("layout", path, None)
                continue
            cost = bm.estimate(text)
            if not bm.fits(cost):
                events.append(("layout", path, "over_budget", cost, text, None, None, role))
                st.warn_dropped("layout", path, cost)
                continue
            bm.spend(cost)
            out.append((role, text, prefix))
            events.append(("layout", path, None, cost, text, None, None, role))
    return out


def squash(messages: list[Emitted]) -> list[dict[str, Any]]:
    """Phase C: join neighbours of the same role with ``"\\n"``; prefix is the OR of the parts."""
    result: list[dict[str, Any]] = []
    last: Any = squash  # before the first message: a value no role equals
    current: dict[str, Any] = {}
    run: list[str] | None = None  # the texts of the current message, once it has two
    for role, text, prefix in messages:
        if role == last:
            if run is None:
                run = [current["content"]]
            run.append(text)
            if prefix:
                current["prefix"] = True
            continue
        if run is not None:
            current["content"] = "\n".join(run)
            run = None
        current = (
            {"role": role, "content": text, "prefix": True} if prefix else {"role": role, "content": text}
        )
        result.append(current)
        last = role
    if run is not None:
        current["content"] = "\n".join(run)
    total = 0
    for message in result:
        total += len(message["content"])
    if total > MAX_OUTPUT_CHARS:
        too_much_output(total)
    return result
