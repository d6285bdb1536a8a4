"""The frozen template model: what a validated template document means, as immutable objects.

Takes: a template document that passed the schema (plain dicts/lists, see
:mod:`storyforge.engine.schema`), plus the compiled leaves and conditions keyed by their template
path. Gives: :class:`Template` and its parts (:class:`LayoutMessage`, :class:`LayoutSlot`,
:class:`Slot`, :class:`MessageNode`, :class:`ForEachNode`, :class:`IfNode`,
:class:`DataRef`, :class:`Budget`).

Why: the renderer works on this model, never on the author's dict. Everything is frozen all
the way down: children in tuples, mappings in ``MappingProxyType``, and DataRef ``args`` and
condition ``value`` deep-copied and deep-frozen (as :class:`storyforge.engine.nodes.FrozenDict`, a
read-only ``dict``, so handlers can still treat ``args`` as the JSON object it was written
as). Compiling never shares or freezes the caller's objects, and nothing reachable from a
compiled template can be changed. Normalisation follows the reference: an empty ``content``
means no content, headers and footers become tuples, ``meta`` and ``description`` are
dropped, unknown keys are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeAlias

from storyforge.engine.errors import TemplatePath
from storyforge.engine.nodes import Text
from storyforge.engine.nodes import freeze as _freeze_data

__all__ = [
    "Budget",
    "ConditionLike",
    "DataRef",
    "ForEachNode",
    "IfNode",
    "LayoutMessage",
    "LayoutNode",
    "LayoutSlot",
    "LeafLike",
    "MessageBlock",
    "MessageNode",
    "PlanNode",
    "Separator",
    "Slot",
    "Template",
    "build_template",
    "freeze",
    "static_text",
    "thaw",
]

Role = Literal["system", "user", "assistant"]


class LeafLike(Protocol):
    """A compiled leaf string: ``render(scope) -> (text, contentful)``."""

    @property
    def has_variables(self) -> bool: ...

    def render(self, scope: Any) -> tuple[str, bool]: ...


class ConditionLike(Protocol):
    """A compiled condition: ``evaluate(scope, resolve) -> bool``; ``refs()`` for linting."""

    def evaluate(self, scope: Any, resolve: Any) -> bool: ...

    def refs(self) -> tuple[tuple[str, Any], ...]: ...


def freeze(value: Any) -> Any:
    """Deep-frozen copy of JSON-like data: mappings -> read-only dicts, lists -> tuples.

    Data handed to source handlers (DataRef ``args``) and condition ``value`` use
    :class:`storyforge.engine.nodes.FrozenDict`, a ``dict`` whose mutating methods raise, so
    handlers may still ``json.dumps`` it or check ``isinstance(args, dict)``; the model's own
    mappings (``Template.slots``) are ``MappingProxyType``.
    """
    return _freeze_data(value)


def static_text(leaf: LeafLike | None) -> str | None:
    """The fixed text of a leaf with no placeholders or blocks (``None`` when it varies)."""
    if leaf is None or leaf.has_variables:
        return None
    parts = getattr(leaf, "parts", None)
    if parts is None or not all(isinstance(p, Text) for p in parts):
        return None
    return "".join(p.value for p in parts)


def thaw(value: Any) -> Any:
    """Plain ``dict``/``list`` copy of frozen data (for JSON output and messages)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


# json.dumps with these options builds an encoder on every call; a warning names its ref by
# this one's output (the same text).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataRef:
    """A named data source and its free-form, deep-frozen ``args`` (``None`` when absent)."""

    source: str
    args: Any = None
    has_args: bool = False
    path: TemplatePath = field(default_factory=TemplatePath, compare=False, repr=False)

    def to_json(self) -> str:
        """Compact JSON of the ref as written (``{"source":"x","args":{...}}``), for messages."""
        body: dict[str, Any] = {"source": self.source}
        if self.has_args:
            body["args"] = thaw(self.args)
        try:
            return _ENCODER.encode(body)
        except ValueError:
            return _ENCODER.encode({"source": self.source})


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """A node or slot budget; ``max_tokens=None`` (written ``{}``) sets no ceiling."""

    max_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageBlock:
    """A message in the layout, a header/footer, or (as :class:`MessageNode`) in a plan."""

    role: Role
    content: str | None = None
    from_: DataRef | None = None
    prefix: bool = False
    skip_if_empty_interpolation: bool = False
    leaf: LeafLike | None = field(default=None, compare=False, repr=False)
    path: TemplatePath = field(default_factory=TemplatePath, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutMessage(MessageBlock):
    """A literal message of the layout; ``name`` is informational."""

    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutSlot:
    """A layout reference to a slot, with optional header and footer blocks."""

    name: str
    header: tuple[MessageBlock, ...] = ()
    footer: tuple[MessageBlock, ...] = ()
    omit_if_empty: bool = True
    path: TemplatePath = field(default_factory=TemplatePath, compare=False, repr=False)


LayoutNode: TypeAlias = LayoutMessage | LayoutSlot


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageNode(MessageBlock):
    """A plan message with an optional node budget."""

    budget: Budget | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Separator:
    """A forEach ``interleave`` separator (always emitted with role ``user``)."""

    text: str | None = None
    leaf: LeafLike | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForEachNode:
    """Loop over a list source, running ``map`` once per item."""

    source: DataRef
    map: tuple[PlanNode, ...]
    order: Literal["asc", "desc"] | None = None
    fill_dir: Literal["append", "prepend"] = "append"
    limit: int | None = None
    interleave: Separator | None = None
    budget: Budget | None = None
    stop_when_out_of_budget: bool = True
    path: TemplatePath = field(default_factory=TemplatePath, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class IfNode:
    """Run ``then`` when the condition holds, ``else_`` otherwise."""

    when: Any  # the condition as written: a frozen mapping or an expression string
    then: tuple[PlanNode, ...]
    else_: tuple[PlanNode, ...] = ()
    condition: ConditionLike | None = field(default=None, compare=False, repr=False)
    path: TemplatePath = field(default_factory=TemplatePath, compare=False, repr=False)


PlanNode: TypeAlias = MessageNode | ForEachNode | IfNode


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """A named slot: filled in ascending ``priority`` order under its optional budget."""

    name: str
    priority: int
    plan: tuple[PlanNode, ...]
    when: Any = None
    condition: ConditionLike | None = field(default=None, compare=False, repr=False)
    budget: Budget | None = None
    path: TemplatePath = field(default_factory=TemplatePath, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Template:
    """A whole template: identity, layout order and slots (in declaration order)."""

    id: str
    name: str
    task: str
    version: int
    layout: tuple[LayoutNode, ...]
    slots: Mapping[str, Slot]


# -- building ----------------------------------------------------------------------------------


def build_template(
    doc: Mapping[str, Any],
    leaves: Mapping[TemplatePath, LeafLike],
    conditions: Mapping[TemplatePath, ConditionLike],
) -> Template:
    """The model of a schema-valid document; ``leaves``/``conditions`` are keyed by path."""
    builder = _Builder(leaves, conditions)
    return builder.template(doc)


class _Builder:
    def __init__(
        self, leaves: Mapping[TemplatePath, LeafLike], conditions: Mapping[TemplatePath, ConditionLike]
    ) -> None:
        self.leaves = leaves
        self.conditions = conditions

    def template(self, doc: Mapping[str, Any]) -> Template:
        root = TemplatePath()
        layout = tuple(self.layout_node(n, root.child("layout", i)) for i, n in enumerate(doc["layout"]))
        slots = {
            name: self.slot(name, spec, root.child("slots", name)) for name, spec in doc["slots"].items()
        }
        return Template(
            id=doc["id"],
            name=doc["name"],
            task=doc["task"],
            version=int(doc["version"]),
            layout=layout,
            slots=MappingProxyType(slots),
        )

    def data_ref(self, raw: Mapping[str, Any], path: TemplatePath) -> DataRef:
        return DataRef(source=raw["source"], args=freeze(raw.get("args")), has_args="args" in raw, path=path)

    def budget(self, raw: Mapping[str, Any] | None) -> Budget | None:
        if raw is None:
            return None
        max_tokens = raw.get("maxTokens")
        return Budget(max_tokens=None if max_tokens is None else int(max_tokens))

    def block(self, kind: Any, raw: Mapping[str, Any], path: TemplatePath, **extra: Any) -> Any:
        """A :class:`MessageBlock` (or subclass ``kind``) of ``raw``, with ``extra`` fields."""
        content = raw.get("content") or None  # an empty content counts as no content
        source = raw.get("from")
        return kind(
            role=raw["role"],
            content=content,
            from_=self.data_ref(source, path / "from") if source is not None else None,
            prefix=bool(raw.get("prefix", False)),
            skip_if_empty_interpolation=bool(raw.get("skipIfEmptyInterpolation", False)),
            leaf=self.leaves.get(path / "content") if content is not None else None,
            path=path,
            **extra,
        )

    def blocks(self, raw: Any, path: TemplatePath) -> tuple[MessageBlock, ...]:
        if raw is None:
            return ()
        if isinstance(raw, list):
            return tuple(self.block(MessageBlock, b, path / i) for i, b in enumerate(raw))
        return (self.block(MessageBlock, raw, path),)

    def layout_node(self, raw: Mapping[str, Any], path: TemplatePath) -> LayoutNode:
        if raw["kind"] == "message":
            return self.block(LayoutMessage, raw, path, name=raw.get("name"))  # type: ignore[no-any-return]
        return LayoutSlot(
            name=raw["name"],
            header=self.blocks(raw.get("header"), path / "header"),
            footer=self.blocks(raw.get("footer"), path / "footer"),
            omit_if_empty=raw.get("omitIfEmpty") is not False,
            path=path,
        )

    def slot(self, name: str, raw: Mapping[str, Any], path: TemplatePath) -> Slot:
        when = raw.get("when")
        condition = self.conditions.get(path / "when") if when is not None else None
        return Slot(
            name=name,
            priority=int(raw["priority"]),
            plan=self.plan(raw["plan"], path / "plan"),
            when=_frozen_when(when, condition),
            condition=condition,
            budget=self.budget(raw.get("budget")),
            path=path,
        )

    def plan(self, raw: list[Any], path: TemplatePath) -> tuple[PlanNode, ...]:
        return tuple(self.plan_node(n, path / i) for i, n in enumerate(raw))

    def plan_node(self, raw: Mapping[str, Any], path: TemplatePath) -> PlanNode:
        kind = raw["kind"]
        if kind == "message":
            return self.block(MessageNode, raw, path, budget=self.budget(raw.get("budget")))  # type: ignore[no-any-return]
        if kind == "forEach":
            inter = raw.get("interleave")
            separator = None
            if inter is not None:
                text = inter.get("text") or None
                separator = Separator(
                    text=text,
                    leaf=self.leaves.get(path.child("interleave", "text")) if text else None,
                )
            limit = raw.get("limit")
            return ForEachNode(
                source=self.data_ref(raw["source"], path / "source"),
                map=self.plan(raw["map"], path / "map"),
                order=raw.get("order"),
                fill_dir=raw.get("fillDir", "append"),
                limit=None if limit is None else int(limit),
                interleave=separator,
                budget=self.budget(raw.get("budget")),
                stop_when_out_of_budget=raw.get("stopWhenOutOfBudget", True) is not False,
                path=path,
            )
        condition = self.conditions.get(path / "when")
        return IfNode(
            when=_frozen_when(raw["when"], condition),
            then=self.plan(raw["then"], path / "then"),
            else_=self.plan(raw.get("else") or [], path / "else"),
            condition=condition,
            path=path,
        )


def _frozen_when(when: Any, condition: ConditionLike | None) -> Any:
    """The condition as written, frozen: the compiled condition already holds an equal frozen
    copy (same keys, values and types), so it is shared rather than frozen again."""
    source = getattr(condition, "source", None)
    if source is not None and when.__class__ is dict and source.__class__ is not str:
        return source
    return freeze(when)
