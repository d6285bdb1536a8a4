"""Render phase A (fill every slot, in priority order, under the budget) and ``render()``.

Takes: the frozen template model (:mod:`storyforge.engine.model`). Gives: :func:`build_slots`, which
turns each slot's plan into precomputed closures once per compiled template (each part built
the first time a render reaches it: a slot whose condition fails, an untaken branch or a loop
over no items costs nothing to compile);
:class:`RenderState` (all per-render state: context, registry, budget manager, warnings,
trace events), which those closures run against; and :func:`render`, which runs phase A,
hands the buffers to :mod:`storyforge.engine.assembler` (layout and squashing) and returns a
:class:`RenderResult`.

Why closures: the plan is fixed at compile time, so every decision that does not depend on
the data (is there a node budget, does the leaf have variables, which sort applies, append or
prepend) is taken once, and a render only walks closures. Nothing here mutates anything
shared but those build-once holders (two threads building one part at once build equal
closures; either is kept), so one compiled template can be rendered from many threads at
once.

Semantics follow reference-semantics.md §6 and §9.1, with decision #1: interleave separators
follow the fill direction of the groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cmp_to_key, lru_cache
from typing import Any, NoReturn, Protocol

from storyforge.engine.assembler import Emitted, LayoutStep, assemble, squash
from storyforge.engine.budget import BudgetManager, Estimator, default_estimator
from storyforge.engine.collation import collation_key
from storyforge.engine.errors import Issue, RenderError, RenderLimitError, StoryforgeError, TemplatePath
from storyforge.engine.feasibility import check_budget
from storyforge.engine.model import (
    DataRef,
    ForEachNode,
    IfNode,
    MessageNode,
    PlanNode,
    Slot,
    Template,
    static_text,
)
from storyforge.engine.nodes import Path, Text
from storyforge.engine.runtime import (
    MAX_OUTPUT_CHARS,
    MAX_RENDER_ITEMS,
    RENDER_NOTES,
    Scope,
    compare_numbers,
    deep_equal,
    expands,
    non_empty,
    restore_data_expansion,
    set_data_expansion,
    take_notes,
    too_many_items,
    too_much_output,
)
from storyforge.engine.sources import MISSING, SourceRegistry
from storyforge.engine.state import FAILED, RenderState, log
from storyforge.engine.trace import RenderTrace, SlotInfo

__all__ = [
    "FAILED",
    "CompiledTemplate",
    "Emitted",
    "Exec",
    "Program",
    "RenderResult",
    "RenderState",
    "SlotProgram",
    "build_slots",
    "collation_key",
    "fill_slots",
    "item_keys",
    "order_items",
    "render",
]


Exec = Callable[["RenderState", Scope, list[Emitted]], None]
"""A compiled plan node: run it in a scope, appending what it emits."""


# -- ordering ----------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _compare(a: Any, b: Any) -> int:
    """The reference comparator: numbers numerically, strings by locale, anything else equal."""
    if _is_number(a) and _is_number(b):
        if a < b:
            return -1
        if a > b:
            return 1
        return 0  # equal, or NaN involved (JS: NaN counts as equal)
    if isinstance(a, str) and isinstance(b, str):
        ka, kb = collation_key(a), collation_key(b)
        return -1 if ka < kb else (1 if ka > kb else 0)
    return 0


def order_items(items: list[Any] | tuple[Any, ...], order: str) -> list[Any]:
    """A sorted copy: stable, ``desc`` negates the comparator (it does not reverse ties).

    Lists of mappings (or other non-comparable values) keep their order for both directions.
    """
    desc = order == "desc"
    if all(isinstance(x, str) for x in items):
        return sorted(items, key=collation_key, reverse=desc)
    if all(_is_number(x) and not (isinstance(x, float) and math.isnan(x)) for x in items):
        return sorted(items, reverse=desc)
    if not any(_is_number(x) or isinstance(x, str) for x in items):
        return list(items)
    if desc:
        return sorted(items, key=cmp_to_key(lambda a, b: _compare(b, a)))
    return sorted(items, key=cmp_to_key(_compare))


# -- compiling plan nodes to closures ----------------------------------------------------------


def build_plan(nodes: tuple[PlanNode, ...]) -> tuple[Exec, ...]:
    return tuple([build_node(n) for n in nodes])


def build_node(node: PlanNode) -> Exec:
    if isinstance(node, MessageNode):
        return _message_exec(node)
    if isinstance(node, ForEachNode):
        return _foreach_exec(node)
    if isinstance(node, IfNode):
        return _if_exec(node)
    raise TypeError(f"unknown plan node {type(node).__name__}")  # pragma: no cover


def _message_exec(node: MessageNode) -> Exec:
    role = node.role
    prefix = node.prefix
    ref = node.from_
    leaf = node.leaf
    skip_empty = node.skip_if_empty_interpolation and leaf is not None and leaf.has_variables
    static = static_text(leaf)
    node_max = node.budget.max_tokens if node.budget is not None else None
    path = node.path

    def run(st: RenderState, scope: Scope, out: list[Emitted]) -> None:
        bm = st.bm
        gmax = bm.max_tokens
        if gmax is not None and bm.consumed >= gmax:
            st.events.append(("message", path, "out_of_budget", None, None, scope, st.slot, role))
            return
        if ref is not None:
            value = st.resolve(ref, scope)
            if value is None or value is FAILED:
                reason = "empty" if value is None else "resolver_error"
                st.events.append(("message", path, reason, None, None, scope, st.slot, role))
                return
            text = value if value.__class__ is str else st.text_from(value, ref, path)
        elif static is not None:
            text = static
        elif leaf is not None:
            try:
                text, contentful = leaf.render(scope)
            except RenderLimitError as exc:
                raise exc.at(path) from None
            if skip_empty and not contentful:
                st.events.append(("message", path, "empty", None, None, scope, st.slot, role))
                return
        else:
            st.events.append(("message", path, "empty", None, None, scope, st.slot, role))
            return
        if not text:
            st.events.append(("message", path, "empty", None, None, scope, st.slot, role))
            return
        if gmax is None and node_max is None and not bm.scopes:
            cost: int | None = None  # nothing counts: the cost is not needed
        else:
            cost = bm.estimate(text)
            if (node_max is not None and cost > node_max) or not bm.fits(cost):
                st.events.append(("message", path, "over_budget", cost, text, scope, st.slot, role))
                return
            bm.spend(cost)
        st.chars += len(text)
        if st.chars > MAX_OUTPUT_CHARS:
            limit_at(too_much_output, st.chars, path)
        out.append((role, text, prefix))
        st.events.append(("message", path, None, cost, text, scope, st.slot, role))

    return run


def limit_at(fail: Callable[[int], None], count: int, path: Any) -> None:
    """Raise ``fail(count)``'s :class:`RenderLimitError` at the node ``path``."""
    try:
        fail(count)
    except RenderLimitError as exc:
        raise exc.at(path) from None


def item_keys(leaf: Any) -> tuple[str, ...] | None:
    """The item keys of a leaf made only of text and ``{{item.key}}`` placeholders, else ``None``.

    Their string values (when they hold no ``{{``, which could expand to less) are part of
    the rendered text, so their lengths give a lower bound of its length without rendering.
    """
    keys: list[str] = []
    for part in getattr(leaf, "parts", ()):
        if isinstance(part, Text):
            continue
        expr = getattr(part, "expr", None)
        segments = getattr(expr, "segments", None)
        if not (
            isinstance(expr, Path) and segments is not None and len(segments) == 2 and segments[0] == "item"
        ):
            return None
        keys.append(segments[1])
    return tuple(keys)


FastItems = Callable[["RenderState", Scope, "list[Any] | tuple[Any, ...]", list[Emitted]], None]
"""The inline loop of :func:`_fast_items`: ``(state, scope, items, out)``."""


def _fast_items(leaf_child: MessageNode, stop: bool, path: TemplatePath) -> FastItems:
    """The loop of a forEach whose map is one templated message (no ``from``, no budget of
    its own, no separator): the message's work done inline for every item."""
    assert leaf_child.leaf is not None
    render_leaf = leaf_child.leaf.render
    role = leaf_child.role
    prefix = leaf_child.prefix
    skip_empty = leaf_child.skip_if_empty_interpolation and leaf_child.leaf.has_variables
    child_path = leaf_child.path
    # The least any item can cost under the default estimator: its text is never empty
    # when emitted and always holds the leaf's literal text, and ceil(L / 4) grows with L.
    literal = "".join(p.value for p in getattr(leaf_child.leaf, "parts", ()) if isinstance(p, Text))
    least_cost = max(1, default_estimator(literal))
    keys = item_keys(leaf_child.leaf)
    literal_len = len(literal)

    def fast_items(
        st: RenderState, scope: Scope, items: list[Any] | tuple[Any, ...], acc: list[Emitted]
    ) -> None:
        bm = st.bm
        events = st.events
        slot = st.slot
        ctx = scope.ctx
        chars = st.chars
        scopes = bm.scopes
        gmax = bm.max_tokens
        if gmax is None and not scopes:  # nothing counted: every item renders (counted as visited)
            for i, item in enumerate(items):
                sub = Scope(ctx, item, None, scope, i)
                try:
                    text, contentful = render_leaf(sub)
                except RenderLimitError as exc:
                    raise exc.at(child_path) from None
                if not text or (skip_empty and not contentful):
                    events.append(("message", child_path, "empty", None, None, sub, slot, role))
                    continue
                chars += len(text)
                if chars > MAX_OUTPUT_CHARS:
                    limit_at(too_much_output, chars, child_path)
                acc.append((role, text, prefix))
                events.append(("message", child_path, None, None, text, sub, slot, role))
            st.chars = chars
            return
        # Once no item can fit any more, stop walking: no later item can be emitted, and this
        # loop calls no handler, so the messages and warnings are exactly those of a full walk
        # (the trace records one out_of_budget event for the first item not visited).
        watch = stop and st.default_estimator
        room = bm.room() if watch else 0
        # After the first item that did not fit, an item whose text is surely longer than
        # 4 * room characters is skipped without being rendered (it could never fit); such
        # items share one trace event, at the first of them.
        tight = False
        passed = 0
        first_passed = 0
        visited = st.visited
        for i, item in enumerate(items):
            if gmax is not None:  # a budget may end the walk early: count as items are visited
                visited += 1
                if visited > MAX_RENDER_ITEMS:
                    limit_at(too_many_items, visited, path)
            if watch:
                if room < least_cost:
                    events.append(
                        ("message", child_path, "out_of_budget", None, None, (scope, i), slot, role)
                    )
                    break
                if tight and keys is not None and item.__class__ is dict:
                    floor = literal_len
                    for key in keys:
                        value = item.get(key) if key else None
                        if value.__class__ is str and not expands(value):
                            floor += len(value)
                    if floor > room << 2:
                        if not passed:
                            first_passed = i
                        passed += 1
                        continue
            if gmax is not None and bm.consumed >= gmax:
                if stop:
                    break
                events.append(("message", child_path, "out_of_budget", None, None, (scope, i), slot, role))
                continue
            sub = Scope(ctx, item, None, scope, i)
            try:
                text, contentful = render_leaf(sub)
            except RenderLimitError as exc:
                raise exc.at(child_path) from None
            if not text or (skip_empty and not contentful):
                events.append(("message", child_path, "empty", None, None, sub, slot, role))
                continue
            cost = bm.estimate(text)
            if not bm.fits(cost):
                events.append(("message", child_path, "over_budget", cost, text, sub, slot, role))
                tight = True
                continue
            bm.spend(cost)
            if watch:
                room = bm.room()
            chars += len(text)
            if chars > MAX_OUTPUT_CHARS:
                limit_at(too_much_output, chars, child_path)
            acc.append((role, text, prefix))
            events.append(("message", child_path, None, cost, text, sub, slot, role))
        st.visited = visited
        st.chars = chars
        if passed:
            note = f"{passed} item{'s' if passed > 1 else ''} from here on too long for what was left, not rendered"
            events.append(
                ("message", child_path, "over_budget", None, note, (scope, first_passed), slot, role)
            )

    return fast_items


def _foreach_exec(node: ForEachNode) -> Exec:
    ref = node.source
    order = node.order
    limit = node.limit
    prepend = node.fill_dir == "prepend"
    stop = node.stop_when_out_of_budget
    has_budget = node.budget is not None
    node_max = node.budget.max_tokens if node.budget is not None else None
    sep_leaf = node.interleave.leaf if node.interleave is not None else None
    path = node.path
    sep_path = path / "interleave"
    # The common shape (one templated message per item, no separator, no node budgets) runs
    # in a loop of its own that does the message's work inline: same semantics, fewer calls.
    leaf_child = node.map[0] if len(node.map) == 1 else None
    fast_items = (
        _fast_items(leaf_child, stop, path)
        if isinstance(leaf_child, MessageNode)
        and leaf_child.from_ is None
        and leaf_child.leaf is not None
        and static_text(leaf_child.leaf) is None
        and leaf_child.budget is None
        and sep_leaf is None
        else None
    )
    # The items' closures are built the first time the general loop runs (never when the
    # loop above does the work, or no render reaches an item); ``built`` holds them then.
    built: list[tuple[Exec, ...] | None] = [None]

    def run(st: RenderState, scope: Scope, out: list[Emitted]) -> None:
        bm = st.bm
        events = st.events
        if has_budget and stop and not bm.has_any():
            events.append(("forEach", path, "out_of_budget", None, None, scope, st.slot, None))
            return
        value = st.resolve(ref, scope)
        if value is FAILED:
            events.append(("forEach", path, "resolver_error", None, None, scope, st.slot, None))
            return
        cls = value.__class__
        if cls is not list and cls is not tuple and not isinstance(value, (list, tuple)):
            reason = "empty" if value is None else "not_a_list"
            events.append(("forEach", path, reason, None, None, scope, st.slot, None))
            return
        if not value:
            events.append(("forEach", path, "empty", 0, None, scope, st.slot, None))
            return
        items: list[Any] | tuple[Any, ...] = order_items(value, order) if order is not None else value
        if limit is not None and len(items) > limit:
            items = items[:limit]
        events.append(("forEach", path, None, len(items), None, scope, st.slot, None))
        if bm.max_tokens is None:
            # With no global budget every item is visited: count them all now, before any.
            st.visited += len(items)
            if st.visited > MAX_RENDER_ITEMS:
                limit_at(too_many_items, st.visited, path)
        if fast_items is not None:
            if node_max is not None:
                bm.scopes.append(node_max)
                depth = len(bm.scopes)
            try:
                if prepend:
                    acc: list[Emitted] = []
                    fast_items(st, scope, items, acc)
                    out.extend(reversed(acc))  # one message per item: reversing the items' messages
                else:
                    fast_items(st, scope, items, out)
            finally:
                if node_max is not None:
                    del bm.scopes[depth - 1 :]
            return
        children = built[0]
        if children is None:
            children = built[0] = build_plan(node.map)
        single = children[0] if len(children) == 1 else None
        last = len(items) - 1
        # Prepending: every group (and separator) is collected into `acc`, with its start in
        # `starts`; the groups are reversed at the end. Appending writes straight into `out`.
        acc = [] if prepend else out
        starts: list[int] = []
        push = scope.push
        if node_max is not None:
            bm.scopes.append(node_max)
            depth = len(bm.scopes)
        try:
            for i, item in enumerate(items):
                gmax = bm.max_tokens
                if stop and gmax is not None and bm.consumed >= gmax:
                    break
                if gmax is not None:  # else counted before the loop
                    st.visited += 1
                    if st.visited > MAX_RENDER_ITEMS:
                        limit_at(too_many_items, st.visited, path)
                sub = push(item, i)
                if prepend:
                    starts.append(len(acc))
                if single is not None:
                    single(st, sub, acc)
                else:
                    for child in children:
                        child(st, sub, acc)
                        if stop and gmax is not None and bm.consumed >= gmax:
                            break
                if sep_leaf is not None and i < last:
                    try:
                        text, _ = sep_leaf.render(sub)
                    except RenderLimitError as exc:
                        raise exc.at(sep_path) from None
                    if text:
                        st.chars += len(text)
                        if st.chars > MAX_OUTPUT_CHARS:
                            limit_at(too_much_output, st.chars, sep_path)
                        if prepend:
                            starts.append(len(acc))
                        if gmax is None and not bm.scopes:
                            acc.append(("user", text, False))
                            events.append(("separator", sep_path, None, None, text, sub, st.slot, "user"))
                        else:
                            cost = bm.estimate(text)
                            if bm.fits(cost):
                                bm.spend(cost)
                                acc.append(("user", text, False))
                                events.append(("separator", sep_path, None, cost, text, sub, st.slot, "user"))
                            else:
                                events.append(
                                    ("separator", sep_path, "over_budget", cost, text, sub, st.slot, "user")
                                )
        finally:
            if node_max is not None:
                del bm.scopes[depth - 1 :]
        if prepend:
            if len(acc) == len(starts) and starts == list(range(len(starts))):  # one message per group
                out.extend(reversed(acc))
            else:
                end = len(acc)
                for start in reversed(starts):
                    out.extend(acc[start:end])
                    end = start

    return run


Test = Callable[[RenderState, Scope], bool]
"""A compiled condition: ``test(state, scope) -> bool``."""


def build_test(when: Any, condition: Any) -> Test:
    """The condition as a closure.

    Structured conditions (§7) are evaluated directly: resolve the ref, then one comparison
    with the runtime's own functions, exactly what the compiled expression would do.
    String expressions run the compiled :class:`~storyforge.engine.nodes.Condition`.
    """
    kind = when.get("type") if isinstance(when, Mapping) else None
    if kind not in ("exists", "nonEmpty", "eq", "neq", "gt", "lt"):

        def evaluate(st: RenderState, scope: Scope) -> bool:
            return bool(condition.evaluate(scope, st.resolver_for(scope)))

        return evaluate
    ref_spec = when["ref"]
    ref = DataRef(
        source=ref_spec["source"], args=ref_spec.get("args"), has_args="args" in ref_spec, path=_NO_PATH
    )
    expected = when.get("value", MISSING)  # no value: undefined, which is not null (decision #20)
    read = RenderState.resolve_for_condition

    if kind == "exists":

        def exists_test(st: RenderState, scope: Scope) -> bool:
            value = read(st, ref, scope)
            return value is not None and value is not MISSING

        return exists_test
    if kind == "nonEmpty":

        def non_empty_test(st: RenderState, scope: Scope) -> bool:
            value = read(st, ref, scope)
            cls = value.__class__
            if cls is list or cls is str or cls is tuple:
                return len(value) > 0
            return non_empty(value)

        return non_empty_test
    if kind == "eq":
        return lambda st, scope: deep_equal(read(st, ref, scope), expected)
    if kind == "neq":
        return lambda st, scope: not deep_equal(read(st, ref, scope), expected)
    op = ">" if kind == "gt" else "<"
    return lambda st, scope: compare_numbers(op, read(st, ref, scope), expected)


def _if_exec(node: IfNode) -> Exec:
    test = build_test(node.when, node.condition)
    # A branch's closures are built the first time it is taken (a branch no render takes
    # costs nothing); ``branches`` holds them once built: [then, else].
    branches: list[tuple[Exec, ...] | None] = [None if node.then else (), None if node.else_ else ()]
    path = node.path

    def run(st: RenderState, scope: Scope, out: list[Emitted]) -> None:
        ok = test(st, scope)
        st.events.append(("if", path, None, None, "then" if ok else "else", scope, st.slot, None))
        children = branches[0] if ok else branches[1]
        if children is None:
            children = build_plan(node.then if ok else node.else_)
            branches[0 if ok else 1] = children
        for child in children:
            child(st, scope, out)

    return run


# -- slots -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotProgram:
    """One slot, ready to run: its condition, budget and compiled plan.

    The plan's closures are built the first time the slot runs (a slot whose condition no
    render meets never pays for them): ``built`` holds them then, ``[plan]``.
    """

    name: str
    priority: int
    test: Test | None
    max_tokens: int | None
    built: list[tuple[Exec, ...] | None]
    slot: Slot


_NO_PATH = TemplatePath()


def build_slots(template: Template) -> tuple[SlotProgram, ...]:
    """Every slot compiled, sorted by priority (stable: ties keep declaration order)."""
    programs = [
        SlotProgram(
            name=name,
            priority=slot.priority,
            test=build_test(slot.when, slot.condition) if slot.condition is not None else None,
            max_tokens=slot.budget.max_tokens if slot.budget is not None else None,
            built=[None],
            slot=slot,
        )
        for name, slot in template.slots.items()
    ]
    programs.sort(key=lambda p: p.priority)
    return tuple(programs)


def fill_slots(st: RenderState, slots: tuple[SlotProgram, ...]) -> dict[str, list[Emitted]]:
    """Phase A: run every slot (used by the layout or not) and return the buffers by name."""
    buffers: dict[str, list[Emitted]] = {}
    root = st.root
    bm = st.bm
    events = st.events
    for program in slots:
        name = program.name
        st.slot = name
        path = program.slot.path
        if program.test is not None and not program.test(st, root):
            buffers[name] = []
            events.append(("slot", path, "condition_false", None, None, None, name, None))
            continue
        events.append(("slot", path, None, None, None, None, name, None))
        plan = program.built[0]
        if plan is None:
            plan = program.built[0] = build_plan(program.slot.plan)
        buf: list[Emitted] = []
        if program.max_tokens is not None:
            bm.scopes.append(program.max_tokens)
            depth = len(bm.scopes)
            try:
                for run in plan:
                    run(st, root, buf)
            finally:
                del bm.scopes[depth - 1 :]
        else:
            for run in plan:
                run(st, root, buf)
        buffers[name] = buf
    st.slot = None
    return buffers


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """The compiled form the renderer runs: slots in fill order and the layout steps."""

    slots: tuple[SlotProgram, ...]
    layout: tuple[LayoutStep, ...]
    slot_info: tuple[SlotInfo, ...]


class CompiledTemplate(Protocol):
    """What :func:`render` needs of a compiled template
    (:class:`storyforge.engine.compiler.CompiledTemplate`, which imports this module)."""

    @property
    def program(self) -> Program: ...

    @property
    def template(self) -> Template: ...

    @property
    def id(self) -> str: ...

    def __hash__(self) -> int: ...


# -- the whole render --------------------------------------------------------------------------


class RenderResult:
    """What one render produced: chat messages, warnings, and the trace of every decision.

    ``messages`` and ``warnings`` are fresh lists owned by the caller. ``trace`` is built on
    first access from what the render recorded, so a render whose trace is never read pays
    only for the recording.

    ``_events`` is what the render recorded, ``_info`` what else builds the trace,
    ``(estimate, budget, consumed, slot_info, compiled template)``, and then the trace itself.
    """

    __slots__ = ("_events", "_info", "messages", "warnings")

    messages: list[dict[str, Any]]
    warnings: list[str]
    _events: list[Any]
    _info: tuple[Any, ...] | RenderTrace

    @property
    def trace(self) -> RenderTrace:
        """Per slot and per node: rendered or skipped, why, and tokens used."""
        info = self._info
        if isinstance(info, RenderTrace):
            return info
        estimate, budget, consumed, slot_info, compiled = info
        trace = self._info = RenderTrace(
            raw=self._events,
            estimator=estimate,
            budget=budget,
            consumed=consumed,
            slot_info=slot_info,
            template=compiled.id,
        )
        return trace

    def __repr__(self) -> str:
        return f"RenderResult(messages={self.messages!r}, warnings={self.warnings!r})"


@lru_cache(maxsize=256)
def _feasibility(compiled: CompiledTemplate, budget: int, estimator: Estimator | None) -> tuple[Issue, ...]:
    """The budget-feasibility issues of a template and budget, logged the first time they meet."""
    issues = check_budget(compiled.template, budget, estimator)
    for issue in issues:
        log.warning("template %r with a %d-token budget: %s", compiled.id, budget, issue.message)
    return issues


def render(
    compiled: CompiledTemplate,
    ctx: Mapping[str, Any] | None,
    registry: Mapping[str, Any] | None = None,
    budget: int | None = None,
    estimator: Estimator | None = None,
) -> RenderResult:
    """Render ``compiled`` against ``ctx`` with the task's source ``registry``.

    ``budget`` is the global token ceiling (``None``: unlimited); ``estimator`` counts tokens
    (default: ``ceil(UTF-16 units / 4)``). Returns messages ``{"role", "content"}`` plus
    ``"prefix": True`` on prefilled assistant messages. A budget that cannot hold the fixed part
    of the layout is logged before the first render (:mod:`storyforge.engine.feasibility`); a
    layout message, header or footer dropped for budget is a warning. Resolver exceptions become warnings;
    any other unexpected exception is raised as :class:`~storyforge.engine.errors.RenderError`.
    """
    if ctx is None:
        ctx = {}
    elif ctx.__class__ is not dict and not isinstance(ctx, Mapping):
        raise RenderError(f"the render context must be a mapping, got {type(ctx).__name__}")
    expansion = "paths"
    if registry.__class__ is SourceRegistry or isinstance(registry, SourceRegistry):
        handlers: Mapping[str, Any] = registry.table
        expansion = registry.data_expansion
    elif registry is None:
        handlers = {}
    elif isinstance(registry, Mapping):
        handlers = registry
    else:
        raise RenderError(
            f"the registry must be a SourceRegistry or a mapping, got {type(registry).__name__}"
        )
    if RENDER_NOTES.warnings is not None:
        take_notes()  # noted outside any render (a leaf or value rendered directly): not ours
    # "off" is rare: only then is the thread's expansion setting changed (and put back)
    previous = set_data_expansion(expansion) if expansion != "paths" else None
    program = compiled.program
    try:
        if budget is not None:
            _feasibility(compiled, budget, estimator)  # said once, before the first such render
        bm = BudgetManager(budget, estimator)
        st = RenderState(ctx, handlers, bm)
        messages = squash(assemble(st, program.layout, fill_slots(st, program.slots)))
    except Exception as exc:  # noqa: BLE001 - raised again, as is or as what it means
        _raise_failure(exc)
    finally:
        if previous is not None:
            restore_data_expansion(previous)
    if RENDER_NOTES.warnings is not None:
        st.warnings.extend(take_notes() or ())
    result = RenderResult()
    result.messages = messages
    result.warnings = st.warnings
    result._events = st.events
    result._info = (
        bm.estimate,
        budget,
        bm.consumed if budget is not None else None,
        program.slot_info,
        compiled,  # its id is read when the trace is
    )
    return result


def _raise_failure(exc: Exception) -> NoReturn:
    """Drop the failed render's notes (they are not the next one's) and raise for ``exc``:
    ``exc`` itself when it is an error of ours, else a
    :class:`~storyforge.engine.errors.RenderLimitError` for nesting too deep or a
    :class:`~storyforge.engine.errors.RenderError` for anything unexpected."""
    take_notes()
    if isinstance(exc, StoryforgeError):
        raise exc
    if isinstance(exc, RecursionError):
        raise RenderLimitError(
            f"Unexpected error during template rendering: nesting too deep ({exc})", limit="recursion"
        ) from exc
    raise RenderError(f"Unexpected error during template rendering: {exc}") from exc
