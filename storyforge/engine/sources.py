"""Named data sources: what a task kind offers to templates, and the handlers that supply it.

Takes: handler functions ``handler(ctx, args) -> value`` keyed by source name, or a task
kind's source definitions. Gives: :class:`SourceRegistry` (an immutable name -> handler
mapping handed to ``render``) and :class:`SourceSpec` (a source's published contract:
accepted args and output shape), which drives source linting and the authoring docs of each
task kind; and the pieces task kinds build their sources from: argument rules
(:class:`ArgRule`, :func:`arg_problems`, :func:`checker`), context readers
(:func:`read_field`, :func:`read_list`), :func:`source_handler`, :func:`field_registry`, and
:class:`SourceTable`, which turns one row per source (:class:`ContextSource`) into the specs,
the rule table, the registry and the lint-time argument check.

Why the shared pieces: every task kind publishes sources that read its context; defining
each source once (name, contract, argument rules, selector) keeps what authors read, what
lint checks and what a handler does at render time from drifting apart.

Reserved sources (``$item``, ``$index``, ``$parent``, ``$globals``, ``$ctx``) are resolved by
the renderer before this registry is consulted, so a handler registered under a reserved name
is never reached.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self

from storyforge.engine.errors import did_you_mean
from storyforge.engine.frozen import FrozenDict

__all__ = [
    "BOOL",
    "INDEX",
    "MISSING",
    "ORDER",
    "POSITIVE_INT",
    "RESERVED_SOURCES",
    "STR_LIST",
    "ArgRule",
    "ContextSource",
    "Handler",
    "Selector",
    "SourceRegistry",
    "SourceSpec",
    "SourceTable",
    "arg_problems",
    "checker",
    "field_registry",
    "one_of",
    "read_field",
    "read_list",
    "source_handler",
    "spec_args",
]

Handler = Callable[[Any, Any], Any]
"""``handler(ctx, args)``: ``args`` is the DataRef's ``args`` or ``None`` when it has none."""

RESERVED_SOURCES: frozenset[str] = frozenset({"$item", "$index", "$parent", "$globals", "$ctx"})


class _Missing:
    """The type of :data:`MISSING`; one instance, equal only to itself, never truthy."""

    __slots__ = ()
    _instance: Any = None

    def __new__(cls) -> Self:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""A DataRef that resolved to nothing (no handler, a handler that raised, a reserved source
or path that is absent), or a comparison without ``value``. JavaScript's ``undefined``: a
missing value is not ``null`` in conditions (``eq null`` on an unknown source is false)."""


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

    __slots__ = ("_handlers", "data_expansion", "paths", "table")

    def __init__(
        self,
        handlers: Mapping[str, Handler] | None = None,
        /,
        *,
        data_expansion: str = "paths",
        **more: Handler,
    ) -> None:
        if data_expansion not in ("paths", "off"):
            raise ValueError(f"data_expansion must be 'paths' or 'off', got {data_expansion!r}")
        #: how ``{{path}}`` inside a string from data renders: ``paths`` expands it to a
        #: scalar (a mapping or list renders empty with a warning), ``off`` keeps it as text
        self.data_expansion = data_expansion
        merged = dict(handlers or {})
        merged.update(more)
        for name, handler in merged.items():
            if not isinstance(name, str):
                raise TypeError(f"source names must be strings, got {name!r}")
            if not callable(handler):
                raise TypeError(f"handler for source {name!r} is not callable")
        self._handlers: Mapping[str, Handler] = MappingProxyType(merged)
        # The plain dict behind `handlers`, which the renderer looks sources up in (a dict
        # lookup is about twice as fast as one through the read-only view); never mutated.
        self.table: dict[str, Handler] = merged

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

    def registry_for(self, ctx: Mapping[str, Any]) -> SourceRegistry:
        """``TaskKind.registry_factory`` when the handlers read the ctx they are given: ``self``."""
        return self

    def extend(self, handlers: Mapping[str, Handler] | None = None, /, **more: Handler) -> SourceRegistry:
        """A new registry with these handlers added (or replaced)."""
        merged = dict(self._handlers)
        merged.update(handlers or {})
        merged.update(more)
        return SourceRegistry(merged, data_expansion=self.data_expansion)

    def with_data_expansion(self, mode: str) -> SourceRegistry:
        """The same handlers with ``data_expansion`` set to ``mode`` (``paths`` or ``off``)."""
        if mode == self.data_expansion:
            return self
        return SourceRegistry(self.table, data_expansion=mode)


# --- argument rules --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgRule:
    """One accepted argument: the words authors read and the test its value must pass."""

    describe: str
    check: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


POSITIVE_INT = ArgRule(describe="int >= 1", check=lambda v: _is_int(v) and v >= 1)
INDEX = ArgRule(describe="int (negative counts from the end)", check=_is_int)
BOOL = ArgRule(describe="true | false", check=lambda v: isinstance(v, bool))
STR_LIST = ArgRule(
    describe="list[str]",
    check=lambda v: isinstance(v, list | tuple) and all(isinstance(x, str) for x in v),
)


def one_of(*choices: str) -> ArgRule:
    """A rule accepting exactly one of ``choices``."""
    return ArgRule(describe=" | ".join(repr(c) for c in choices), check=lambda v: v in choices)


ORDER = one_of("asc", "desc")


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def arg_problems(source: str, args: Any, rules: Mapping[str, ArgRule]) -> list[str]:
    """Every problem with ``args`` given to ``source`` (empty when they are fine).

    ``None`` (no args) is always fine; otherwise args must be a mapping whose keys are
    in ``rules`` and whose values pass them.
    """
    if args is None:
        return []
    if not rules:
        return [f"source '{source}' takes no args, got {_show(args)}"]
    accepted = ", ".join(rules)
    if not isinstance(args, Mapping):
        return [f"args of source '{source}' must be a mapping with keys {accepted}, got {_show(args)}"]
    problems: list[str] = []
    for key, value in args.items():
        rule = rules.get(key) if isinstance(key, str) else None
        if rule is None:
            hint = did_you_mean(str(key), rules, show="'{}'".format)
            problems.append(f"source '{source}' has no arg '{key}'.{hint} Accepted: {accepted}")
        elif not rule.check(value):
            problems.append(f"arg '{key}' of source '{source}' must be {rule.describe}, got {_show(value)}")
    return problems


def spec_args(rules: Mapping[str, ArgRule]) -> dict[str, str]:
    """The ``SourceSpec.args`` text for a rule table."""
    return {name: rule.describe for name, rule in rules.items()}


def checker(rules: Mapping[str, Mapping[str, ArgRule]]) -> Callable[[str, Any], list[str]]:
    """``TaskKind.check_args`` for a table of source name -> rule table.

    At lint time it reports bad *values* of declared arguments only: unknown argument
    names and non-mapping args are reported by the linter from ``SourceSpec.args``, so
    nothing is reported twice. The handlers check names and values at render time.
    """

    def check_args(source: str, args: Any) -> list[str]:
        table = rules.get(source)
        if not table or not isinstance(args, Mapping):
            return []
        known = {key: value for key, value in args.items() if key in table}
        return arg_problems(source, known, table)

    return check_args


# --- reading the context ---------------------------------------------------------------------

Selector = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
"""``select(ctx, args)``: a source's value; ``args`` is ``{}`` when the DataRef has none."""


def read_field(key: str, *, required: bool = False) -> Selector:
    """A selector giving ``ctx[key]``: ``None`` when it is missing, or ``KeyError`` if ``required``."""
    if required:
        return lambda ctx, _args: ctx[key]
    return lambda ctx, _args: ctx.get(key)


_LISTS = (list, tuple)


def read_list(key: str, select: Callable[[list[Any], Mapping[str, Any]], Any] | None = None) -> Selector:
    """A selector over the list in ``ctx[key]``, narrowed by ``select(items, args)`` when given.

    A missing or null field is ``[]``; any other non-list raises ``TypeError`` naming the field.
    """

    def read(ctx: Mapping[str, Any], args: Mapping[str, Any]) -> Any:
        value = ctx.get(key)
        if value is None:
            items: list[Any] = []
        elif value.__class__ is list or isinstance(value, _LISTS):
            items = list(value)
        else:
            raise TypeError(f"context field '{key}' must be a list, got {type(value).__name__}")
        return items if select is None else select(items, args)

    return read


_PASSED_ARGS = 256
"""How many distinct args that passed their check one handler remembers."""


def source_handler(source: str, select: Selector, rules: Mapping[str, ArgRule] | None = None) -> Handler:
    """The registry handler of ``source``: ``select(ctx, args or {})``.

    With ``rules`` it first checks its args and the context: bad args raise ``ValueError``
    naming the source and the argument, a context that is not a mapping ``TypeError``; the
    engine turns either into a render warning and treats the data as absent. ``rules=None``
    passes args through unchecked, for kinds whose sources take none and whose templates are
    compiled without argument linting.
    """
    if rules is None:

        def handler(ctx: Any, args: Any) -> Any:
            return select(ctx, args or {})

    else:
        checked = rules
        # Args from a compiled template are deep-frozen (FrozenDict), so their verdict never
        # changes: each one that passed is remembered (a few per template) and not checked
        # again. They are remembered by identity, the object held so its id is not reused (a
        # lookup by value would hash the args in Python on every call).
        passed: dict[int, FrozenDict] = {}

        def handler(ctx: Any, args: Any) -> Any:
            if args is not None and passed.get(id(args)) is not args:
                problems = arg_problems(source, args, checked)
                if problems:
                    raise ValueError("; ".join(problems))
                if args.__class__ is FrozenDict:
                    try:
                        hash(args)  # a mutable value inside (not deep-frozen): checked every time
                    except TypeError:
                        pass
                    else:
                        if len(passed) >= _PASSED_ARGS:
                            passed.clear()
                        passed[id(args)] = args
            if ctx.__class__ is not dict and not isinstance(ctx, Mapping):
                raise TypeError(f"the context must be a mapping, got {type(ctx).__name__}")
            return select(ctx, args or {})

    handler.__name__ = f"source_{source}"
    return handler


def field_registry(specs: Iterable[SourceSpec], *, required: bool = False) -> SourceRegistry:
    """A registry whose handler for each spec gives the context field of the same name.

    Args are not checked (see :func:`source_handler`); ``required`` makes a missing field a
    ``KeyError`` (a render warning) instead of ``None``.
    """
    return SourceRegistry({spec.name: _field_handler(spec.name, required) for spec in specs})


def _field_handler(key: str, required: bool) -> Handler:
    """``source_handler(key, read_field(key, required=required))`` in one call: the field
    selector takes no args, so there is nothing to pass on (these run once per render)."""
    if required:

        def handler(ctx: Any, args: Any) -> Any:
            return ctx[key]

    else:

        def handler(ctx: Any, args: Any) -> Any:
            return ctx.get(key)

    handler.__name__ = f"source_{key}"
    return handler


# --- whole task kinds -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextSource:
    """One source of a task kind: its published contract, its argument rules and its selector.

    ``select`` defaults to reading the context field named like the source; ``rules`` (none:
    the source takes no args) are checked by the handler at render time and by lint.
    """

    name: str
    returns: str
    description: str = ""
    rules: Mapping[str, ArgRule] = field(default_factory=lambda: MappingProxyType({}))
    select: Selector | None = None

    @property
    def spec(self) -> SourceSpec:
        return SourceSpec(
            name=self.name, returns=self.returns, args=spec_args(self.rules), description=self.description
        )

    def handler(self) -> Handler:
        return source_handler(self.name, self.select or read_field(self.name), self.rules)


class SourceTable:
    """A task kind's sources defined once, one :class:`ContextSource` per source.

    Gives ``specs`` (``TaskKind.sources``), ``rules`` (source name -> rule table), ``registry``
    (one registry for every context, since handlers read the ctx they are given) and
    ``check_args`` (``TaskKind.check_args``).
    """

    __slots__ = ("check_args", "registry", "rules", "specs")

    def __init__(self, *sources: ContextSource) -> None:
        self.specs: tuple[SourceSpec, ...] = tuple(source.spec for source in sources)
        self.rules: Mapping[str, Mapping[str, ArgRule]] = MappingProxyType(
            {source.name: source.rules for source in sources}
        )
        self.registry = SourceRegistry({source.name: source.handler() for source in sources})
        self.check_args: Callable[[str, Any], list[str]] = checker(self.rules)

    def registry_for(self, ctx: Mapping[str, Any]) -> SourceRegistry:
        """``TaskKind.registry_factory``: the same registry for every context."""
        return self.registry.registry_for(ctx)
