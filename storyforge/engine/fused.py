"""The compile stages in one walk, for the common case: a plain document with nothing to report.

Takes: a template document as the caller gave it, the task it must be for, and whether the
compiler wants the document's source uses (for source linting). Gives: the frozen
:class:`~storyforge.engine.model.Template`, the notes (:func:`storyforge.engine.linter.notes`)
and the :class:`~storyforge.engine.linter.RefSite` list the compiler lints, or ``None``.

Why: each stage of compiling (the plain copy of :func:`~storyforge.engine.schema.normalize`,
the schema check, :func:`~storyforge.engine.linter.collect`, the structure checks, the notes
and :func:`~storyforge.engine.model.build_template`) walks the whole document again, and for
a template compiled once and rendered a few times those walks were most of its cost. A
document that is already plain data (exact ``dict``, ``list``, ``str``, ``int``, ``float``,
``bool`` and ``None``; string keys; valid text; at most
:data:`~storyforge.engine.schema.MAX_DEPTH` levels deep), that satisfies the schema in the
ways :func:`~storyforge.engine.schema.plainly_valid` recognises, whose leaves and conditions
parse, whose layout names existing slots and whose ``prefix: true`` messages are all
assistant messages, is checked, linted and built here in one walk; the result equals what
the separate stages give. The walk answers ``None`` at the first thing that is off or that
it does not handle, and the compiler then runs the separate stages, which find and word
every issue (with its path, line and column) exactly as before; ``tests/test_fused.py``
compares the two on generated and mutated templates.

Nothing the caller passed is kept: the model holds strings (immutable) and frozen copies
(:func:`~storyforge.engine.model.freeze`), as it does when built from the normalised copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, TypeGuard, TypeVar

from storyforge.engine.errors import Issue, TemplatePath, TemplateValidationError
from storyforge.engine.linter import RefSite, _check_keys
from storyforge.engine.model import (
    Budget,
    DataRef,
    ForEachNode,
    IfNode,
    LayoutMessage,
    LayoutNode,
    LayoutSlot,
    MessageBlock,
    MessageNode,
    PlanNode,
    Separator,
    Slot,
    Template,
    freeze,
)
from storyforge.engine.nodes import Leaf
from storyforge.engine.parser import _compile_leaf_cached, compile_condition
from storyforge.engine.schema import MAX_DEPTH

__all__ = ["compile_plain"]

# ``_new(_Path, path + (key,))`` is ``path / key`` without a Python-level call.
_new = tuple.__new__
_Path = TemplatePath

_ABSENT: Any = object()

# tuples, not sets: membership by equality, so an unhashable value is simply not in them
_ROLES = "system", "user", "assistant"
_ROLE_SET = frozenset(_ROLES)  # for a value known to be a string (a hash, not three compares)
_CONDITION_TYPES = "exists", "nonEmpty", "eq", "neq", "gt", "lt"

# The keys whose values each kind of mapping checks itself; any other key's value only has to
# be plain data (the schema leaves it free), and unknown keys are also looked at for a note.
_TEMPLATE_KEYS = frozenset({"id", "name", "task", "description", "version", "layout", "slots"})
_BLOCK_KEYS = frozenset({"role", "content", "from", "prefix", "skipIfEmptyInterpolation"})
_LAYOUT_MESSAGE_KEYS = _BLOCK_KEYS | {"kind", "name"}
_PLAN_MESSAGE_KEYS = _BLOCK_KEYS | {"kind", "budget"}
_LAYOUT_SLOT_KEYS = frozenset({"kind", "name", "header", "footer", "omitIfEmpty"})
_SLOT_KEYS = frozenset({"priority", "when", "budget", "plan", "meta"})
_FOR_EACH_KEYS = frozenset(
    {"kind", "source", "map", "order", "fillDir", "limit", "interleave", "budget", "stopWhenOutOfBudget"}
)
_IF_KEYS = frozenset({"kind", "when", "then", "else"})
_REF_KEYS = frozenset({"source", "args"})
_BUDGET_KEYS = frozenset({"maxTokens"})
_SCALARS = frozenset({int, bool, float, type(None)})  # str is checked for valid text


_T = TypeVar("_T")


def _maker(cls: type[_T]) -> Callable[..., _T]:
    """What ``cls(**fields)`` gives for a frozen, slotted model dataclass, with every field
    required by name, made without the generated ``__init__``'s ``object.__setattr__`` call
    per field (which was a third of building the model).

    The object is made as an instance of an unfrozen twin of ``cls`` (the same base and the
    same slots, and the plain ``object.__setattr__``, so each field is one specialised slot
    store), then given its class: ``cls``'s layout is the twin's, which Python checks on the
    assignment. That is cheaper than calling each slot's own setter, and the result is the
    frozen ``cls`` object its ``__init__`` gives. The function is generated from the class's
    field names alone (no template value ever reaches its source); ``tests/test_fused.py``
    checks every maker against its class."""
    if hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} must be a slotted dataclass without __post_init__")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    twin = type(
        f"_Unfrozen{cls.__name__}",
        (cls.__base__ or object,),
        {
            "__slots__": cls.__dict__["__slots__"],
            # object's own, so that making one and setting a field are the plain C ones even
            # under a frozen base with its own __init__
            "__init__": object.__init__,
            "__setattr__": object.__setattr__,
            "__delattr__": object.__delattr__,
            "__module__": __name__,
        },
    )
    namespace: dict[str, Any] = {"cls": cls, "twin": twin}
    lines = [f"def make(*, {', '.join(names)}):", "    made = twin()"]
    lines.extend(f"    made.{name} = {name}" for name in names)
    lines += ["    made.__class__ = cls", "    return made"]
    exec("\n".join(lines), namespace)  # noqa: S102 - source made of our own field names
    make: Callable[..., _T] = namespace["make"]
    return make


_Budget = _maker(Budget)
_DataRef = _maker(DataRef)
_ForEachNode = _maker(ForEachNode)
_IfNode = _maker(IfNode)
_LayoutMessage = _maker(LayoutMessage)
_LayoutSlot = _maker(LayoutSlot)
_MessageBlock = _maker(MessageBlock)
_MessageNode = _maker(MessageNode)
_Separator = _maker(Separator)
_Slot = _maker(Slot)
_Template = _maker(Template)
_Issue = _maker(Issue)
MAKERS = {
    Budget: _Budget,
    DataRef: _DataRef,
    ForEachNode: _ForEachNode,
    IfNode: _IfNode,
    LayoutMessage: _LayoutMessage,
    LayoutSlot: _LayoutSlot,
    MessageBlock: _MessageBlock,
    MessageNode: _MessageNode,
    Separator: _Separator,
    Slot: _Slot,
    Template: _Template,
    Issue: _Issue,
}
"""The makers, by class (what tests compare)."""


class _Decline(Exception):
    """Something the walk does not accept: the compiler runs the separate stages instead."""


def _encodes(text: str) -> bool:
    """``text`` (not ASCII) is valid Unicode: no lone surrogate, nor a pair written in halves
    (which :func:`~storyforge.engine.schema.normalize` joins)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(value: Any) -> TypeGuard[str]:
    return value.__class__ is str and (value.isascii() or _encodes(value))


def _plain(value: Any, depth: int) -> bool:
    """``value``, found ``depth`` levels down, is plain JSON data as
    :func:`~storyforge.engine.schema.normalize` would copy it unchanged and with no issue."""
    cls = value.__class__
    if cls is str:
        return value.isascii() or _encodes(value)
    if cls is dict:
        if depth >= MAX_DEPTH:
            return False
        depth += 1
        for k, v in value.items():
            if k.__class__ is not str or not (k.isascii() or _encodes(k)):
                return False
            c = v.__class__
            if not ((c is str and v.isascii()) or c is int or c is bool or _plain(v, depth)):
                return False
        return True
    if cls is list:
        if depth >= MAX_DEPTH:
            return False
        depth += 1
        for v in value:
            c = v.__class__
            if not ((c is str and v.isascii()) or c is int or c is bool or _plain(v, depth)):
                return False
        return True
    return value is None or cls is int or cls is bool or cls is float


def _other_keys(node: dict[str, Any], checked: frozenset[str], depth: int) -> None:
    """The keys of ``node`` (``depth`` levels down) outside ``checked`` must be plain data."""
    depth += 1
    for key in node.keys() - checked:
        if key.__class__ is not str or not (key.isascii() or _encodes(key)) or not _plain(node[key], depth):
            raise _Decline


def _budget(raw: Any, depth: int) -> int | None:
    """The ``maxTokens`` of a budget mapping ``depth`` levels down (``None`` when it sets none)."""
    if raw.__class__ is not dict or depth >= MAX_DEPTH:
        raise _Decline
    if not _BUDGET_KEYS.issuperset(raw):
        _other_keys(raw, _BUDGET_KEYS, depth)
    limit = raw.get("maxTokens", _ABSENT)
    if limit is _ABSENT:
        return None
    if limit.__class__ is not int or limit < 1:
        raise _Decline
    return limit


def _leaf(text: str) -> Leaf:
    """What :func:`~storyforge.engine.parser.compile_leaf` gives for ``text`` (from its cache;
    the path it takes only names errors)."""
    leaf = _compile_leaf_cached(text)
    if not isinstance(leaf, Leaf):
        raise _Decline  # the text does not parse
    return leaf


def compile_plain(
    doc: Any, task: str | None, want_refs: bool
) -> tuple[Template, tuple[Issue, ...], list[RefSite] | None] | None:
    """The model, notes and (when ``want_refs``) source uses of ``doc``; ``None`` when the
    separate stages must look at it (see the module docstring)."""
    walk = _Walk(want_refs)
    try:
        model = walk.template(doc, task)
    except _Decline:
        return None
    refs = walk.refs
    if refs is not None:
        for path, condition in walk.expressions:
            for source, args in condition.refs():
                refs.append(RefSite(path=path, source=source, args=args, has_args=args is not None))
    return model, (*walk.budget_notes, *walk.unused_notes(doc["slots"]), *walk.key_notes), refs


class _Walk:
    __slots__ = ("budget_notes", "expressions", "key_notes", "refs", "shown")

    def __init__(self, want_refs: bool) -> None:
        self.refs: list[RefSite] | None = [] if want_refs else None
        self.expressions: list[tuple[TemplatePath, Any]] = []  # string conditions, for their refs
        self.budget_notes: list[Issue] = []
        self.key_notes: list[Issue] = []
        self.shown: set[str] = set()  # slot names the layout shows

    def unused_notes(self, slots: dict[str, Any]) -> list[Issue]:
        shown = self.shown
        return [
            _Issue(
                code="unused_slot",
                path=_new(_Path, ("slots", name)),
                message=f"slot {name!r} is not in the layout: it still runs and uses budget",
                line=None,
                column=None,
                context=None,
            )
            for name in slots
            if name not in shown
        ]

    # -- the document ---------------------------------------------------------------------------

    def template(self, doc: Any, task: str | None) -> Template:
        if doc.__class__ is not dict:
            raise _Decline
        if not _TEMPLATE_KEYS.issuperset(doc):
            _other_keys(doc, _TEMPLATE_KEYS, 0)
            _check_keys(self.key_notes, doc, "template", ())
        ident = doc.get("id")
        name = doc.get("name")
        kind = doc.get("task")
        version = doc.get("version")
        layout = doc.get("layout")
        slots = doc.get("slots")
        description = doc.get("description", "")
        if not (
            _text(ident)
            and _text(name)
            and _text(kind)
            and _text(description)
            and version.__class__ is int
            and version == 1
            and layout.__class__ is list
            and slots.__class__ is dict
            and (task is None or kind == task)
        ):
            raise _Decline
        nodes = tuple([self.layout_node(node, i) for i, node in enumerate(layout)])
        built = {name: self.slot(name, spec, _new(_Path, ("slots", name))) for name, spec in slots.items()}
        if not self.shown <= slots.keys():
            raise _Decline  # the layout names a slot that does not exist
        return _Template(
            id=ident, name=name, task=kind, version=1, layout=nodes, slots=MappingProxyType(built)
        )

    def ref(self, raw: Any, path: TemplatePath, depth: int) -> DataRef:
        """A DataRef mapping ``depth`` levels down."""
        if raw.__class__ is not dict or depth >= MAX_DEPTH:
            raise _Decline
        source = raw.get("source")
        if not _text(source):
            raise _Decline
        args = raw.get("args")
        has_args = "args" in raw
        if not _REF_KEYS.issuperset(raw):
            _other_keys(raw, _REF_KEYS, depth)
        if has_args and args.__class__ not in _SCALARS and not _plain(args, depth + 1):
            raise _Decline
        if self.refs is not None:
            self.refs.append(RefSite(path=path, source=source, args=args, has_args=has_args))
        return _DataRef(source=source, args=freeze(args), has_args=has_args, path=path)

    def block(self, make: Any, node: dict[str, Any], path: TemplatePath, depth: int, **extra: Any) -> Any:
        """A message block (``node``, ``depth`` levels down) from ``make`` with ``extra`` fields."""
        role = node.get("role")
        if role.__class__ is not str or role not in _ROLE_SET:
            raise _Decline
        content = node.get("content")
        leaf = None
        if content.__class__ is str:
            if not content:
                content = None  # an empty content counts as no content
            elif content.isascii() or _encodes(content):
                leaf = _compile_leaf_cached(content)  # what compile_leaf gives (its path names errors)
                if not isinstance(leaf, Leaf):
                    raise _Decline  # the text does not parse
            else:
                raise _Decline
        elif content is not None or "content" in node:
            raise _Decline
        source = node.get("from", _ABSENT)
        prefix = node.get("prefix", False)
        skip = node.get("skipIfEmptyInterpolation", False)
        if prefix.__class__ is not bool or skip.__class__ is not bool or (prefix and role != "assistant"):
            raise _Decline
        return make(
            role=role,
            content=content,
            from_=None if source is _ABSENT else self.ref(source, _new(_Path, path + ("from",)), depth + 1),
            prefix=prefix,
            skip_if_empty_interpolation=skip,
            leaf=leaf,
            path=path,
            **extra,
        )

    def blocks(self, raw: Any, path: TemplatePath, depth: int) -> tuple[MessageBlock, ...]:
        """A header or footer (``depth`` levels down): one block or a list of them."""
        if raw.__class__ is dict:
            if not _BLOCK_KEYS.issuperset(raw):
                _other_keys(raw, _BLOCK_KEYS, depth)
            return (self.block(_MessageBlock, raw, path, depth),)
        if raw.__class__ is not list or depth >= MAX_DEPTH:
            raise _Decline
        depth += 1
        out = []
        for i, block in enumerate(raw):
            if block.__class__ is not dict:
                raise _Decline
            if not _BLOCK_KEYS.issuperset(block):
                _other_keys(block, _BLOCK_KEYS, depth)
            out.append(self.block(_MessageBlock, block, _new(_Path, path + (i,)), depth))
        return tuple(out)

    def layout_node(self, node: Any, i: int) -> LayoutNode:
        path = _new(_Path, ("layout", i))
        if node.__class__ is not dict:
            raise _Decline
        kind = node.get("kind")
        if kind == "message":
            if not _LAYOUT_MESSAGE_KEYS.issuperset(node):
                _other_keys(node, _LAYOUT_MESSAGE_KEYS, 2)
                _check_keys(self.key_notes, node, "block", path)
            name = node.get("name")
            if (name is not None or "name" in node) and not _text(name):
                raise _Decline
            return self.block(_LayoutMessage, node, path, 2, name=name)  # type: ignore[no-any-return]
        if kind != "slot":
            raise _Decline
        if not _LAYOUT_SLOT_KEYS.issuperset(node):
            _other_keys(node, _LAYOUT_SLOT_KEYS, 2)
            _check_keys(self.key_notes, node, "layout_slot", path)
        name = node.get("name")
        if not _text(name):
            raise _Decline
        self.shown.add(name)
        header = node.get("header", _ABSENT)
        footer = node.get("footer", _ABSENT)
        omit = node.get("omitIfEmpty", True)
        if omit.__class__ is not bool:
            raise _Decline
        return _LayoutSlot(
            name=name,
            header=() if header is _ABSENT else self.blocks(header, _new(_Path, path + ("header",)), 3),
            footer=() if footer is _ABSENT else self.blocks(footer, _new(_Path, path + ("footer",)), 3),
            omit_if_empty=omit,
            path=path,
        )

    def condition(self, when: Any, path: TemplatePath, depth: int) -> Any:
        """The compiled condition of ``when`` (``path``, ``depth`` levels down) and its frozen
        form as the model keeps it."""
        if when.__class__ is str:
            if not (when.isascii() or _encodes(when)):
                raise _Decline
            try:
                condition = compile_condition(when)
            except TemplateValidationError:
                raise _Decline from None
            if self.refs is not None:
                self.expressions.append((path, condition))
            return condition, when
        if (
            when.__class__ is not dict
            or not _plain(when, depth)
            or when.get("type") not in _CONDITION_TYPES
            or "ref" not in when
        ):
            raise _Decline
        ref = when["ref"]
        if ref.__class__ is not dict or ref.get("source").__class__ is not str:
            raise _Decline
        try:
            condition = compile_condition(when)  # freezes the mapping itself
        except TemplateValidationError:
            raise _Decline from None
        if self.refs is not None:
            self.refs.append(
                RefSite(
                    path=_new(_Path, path + ("ref",)),
                    source=ref["source"],
                    args=ref.get("args"),
                    has_args="args" in ref,
                )
            )
        # the compiled condition holds an equal frozen copy (what model._frozen_when shares)
        source = getattr(condition, "source", None)
        return condition, source if source is not None and source.__class__ is not str else freeze(when)

    # -- slots and plans --------------------------------------------------------------------------

    def slot(self, name: Any, spec: Any, path: TemplatePath) -> Slot:
        if not _text(name) or spec.__class__ is not dict:
            raise _Decline
        if not _SLOT_KEYS.issuperset(spec):
            _other_keys(spec, _SLOT_KEYS, 2)
            _check_keys(self.key_notes, spec, "slot", path)
        priority = spec.get("priority")
        if priority.__class__ is not int or priority < 0:
            raise _Decline
        when = spec.get("when", _ABSENT)
        condition = frozen_when = None
        if when is not _ABSENT:
            condition, frozen_when = self.condition(when, _new(_Path, path + ("when",)), 3)
        meta = spec.get("meta", _ABSENT)
        if meta is not _ABSENT and (meta.__class__ is not dict or not _plain(meta, 3)):
            raise _Decline
        budget = spec.get("budget", _ABSENT)
        limit = None if budget is _ABSENT else _budget(budget, 3)
        plan = spec.get("plan", _ABSENT)
        if plan is _ABSENT:
            raise _Decline
        return _Slot(
            name=name,
            priority=priority,
            plan=self.plan(plan, _new(_Path, path + ("plan",)), 3, limit),
            when=frozen_when,
            condition=condition,
            budget=None if budget is _ABSENT else _Budget(max_tokens=limit),
            path=path,
        )

    def plan(self, nodes: Any, path: TemplatePath, depth: int, enclosing: int | None) -> tuple[PlanNode, ...]:
        """The plan list ``nodes`` (``depth`` levels down) under the ``enclosing`` token limit."""
        if nodes.__class__ is not list or depth >= MAX_DEPTH:
            raise _Decline
        depth += 1
        if nodes and depth >= MAX_DEPTH:
            raise _Decline
        out: list[PlanNode] = []
        for i, node in enumerate(nodes):
            here = _new(_Path, path + (i,))
            if node.__class__ is not dict:
                raise _Decline
            kind = node.get("kind")
            if kind == "message":
                if not _PLAN_MESSAGE_KEYS.issuperset(node):
                    _other_keys(node, _PLAN_MESSAGE_KEYS, depth)
                    _check_keys(self.key_notes, node, "block", here)
                budget = node.get("budget", _ABSENT)
                if budget is _ABSENT:
                    out.append(self.block(_MessageNode, node, here, depth, budget=None))
                    continue
                own = _budget(budget, depth + 1)
                if own is not None and enclosing is not None and own > enclosing:
                    self.limit_note(here, own, enclosing)
                out.append(self.block(_MessageNode, node, here, depth, budget=_Budget(max_tokens=own)))
            elif kind == "forEach":
                out.append(self.for_each(node, here, depth, enclosing))
            elif kind == "if":
                if not _IF_KEYS.issuperset(node):
                    _other_keys(node, _IF_KEYS, depth)
                    _check_keys(self.key_notes, node, "if", here)
                when = node.get("when", _ABSENT)
                then = node.get("then", _ABSENT)
                if when is _ABSENT or then is _ABSENT:
                    raise _Decline
                condition, frozen_when = self.condition(when, _new(_Path, here + ("when",)), depth + 1)
                branch = self.plan(then, _new(_Path, here + ("then",)), depth + 1, enclosing)
                other = node.get("else", _ABSENT)
                out.append(
                    _IfNode(
                        when=frozen_when,
                        then=branch,
                        else_=()
                        if other is _ABSENT
                        else self.plan(other, _new(_Path, here + ("else",)), depth + 1, enclosing),
                        condition=condition,
                        path=here,
                    )
                )
            else:
                raise _Decline
        return tuple(out)

    def limit_note(self, here: TemplatePath, own: int, enclosing: int) -> None:
        self.budget_notes.append(
            _Issue(
                code="budget_above_parent",
                path=_new(_Path, here + ("budget", "maxTokens")),
                message=f"maxTokens {own} is above the enclosing budget of {enclosing}; "
                "the enclosing one always wins",
                line=None,
                column=None,
                context=None,
            )
        )

    def for_each(
        self, node: dict[str, Any], here: TemplatePath, depth: int, enclosing: int | None
    ) -> ForEachNode:
        if not _FOR_EACH_KEYS.issuperset(node):
            _other_keys(node, _FOR_EACH_KEYS, depth)
            _check_keys(self.key_notes, node, "forEach", here)
        budget = node.get("budget", _ABSENT)
        own = None
        if budget is not _ABSENT:
            own = _budget(budget, depth + 1)
            if own is not None and enclosing is not None and own > enclosing:
                self.limit_note(here, own, enclosing)
        source = node.get("source", _ABSENT)
        if source is _ABSENT:
            raise _Decline
        ref = self.ref(source, _new(_Path, here + ("source",)), depth + 1)
        separator = None
        inter = node.get("interleave", _ABSENT)
        if inter is not _ABSENT:
            if (
                inter.__class__ is not dict
                or not _plain(inter, depth + 1)
                or inter.get("kind") != "separator"
            ):
                raise _Decline
            text = inter.get("text")
            leaf = None
            if text is not None or "text" in inter:
                if text.__class__ is not str:
                    raise _Decline
                if text:
                    leaf = _leaf(text)
                else:
                    text = None
            separator = _Separator(text=text, leaf=leaf)
        order = node.get("order")
        fill = node.get("fillDir", "append")
        limit = node.get("limit")
        if (
            (order is not None or "order" in node)
            and order not in ("asc", "desc")
            or fill not in ("append", "prepend")
            or (limit is not None or "limit" in node)
            and (limit.__class__ is not int or limit < 1)
        ):
            raise _Decline
        steps = node.get("map", _ABSENT)
        stop = node.get("stopWhenOutOfBudget", True)
        if steps is _ABSENT or stop.__class__ is not bool:
            raise _Decline
        inner = own if own is not None and (enclosing is None or own < enclosing) else enclosing
        return _ForEachNode(
            source=ref,
            map=self.plan(steps, _new(_Path, here + ("map",)), depth + 1, inner),
            order=order,
            fill_dir=fill,
            limit=limit,
            interleave=separator,
            budget=None if budget is _ABSENT else _Budget(max_tokens=own),
            stop_when_out_of_budget=stop,
            path=here,
        )
