"""compile_template: an untrusted template document -> an immutable, render-ready template.

Takes: a template as a mapping (dict, YAML or JSON data) or a
:class:`~storyforge.engine.loader.LoadedTemplate`, plus what it will be used for (``task``,
``allowed_sources``, optionally the sources' specs and an argument checker). Gives:
:class:`CompiledTemplate` (frozen, hashable by content, safe to share between threads) or one
:class:`~storyforge.engine.errors.TemplateValidationError` listing every issue of every stage.

Stages, all of which always run: normalise (deep copy into plain data) -> schema -> task
binding -> parse every leaf string and condition -> source lint (names, and args when specs or
a checker are given) -> structure guards. Only when nothing was found is the frozen model
built and its plan compiled to closures. Results are cached by (the document's exact marshal
image, task, allowed sources, ...) in a bounded LRU, so compiling the same template again is a
copy, a hash and a lookup; the canonical-JSON content hash is made only when asked for.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from storyforge.engine.assembler import build_layout
from storyforge.engine.errors import Issue, TemplatePath, TemplateValidationError
from storyforge.engine.linter import RefSite, check_structure, check_task, collect, lint_sources, notes
from storyforge.engine.loader import LoadedTemplate
from storyforge.engine.model import ConditionLike, LayoutSlot, LeafLike, Template, build_template
from storyforge.engine.parser import compile_condition, compile_leaf, gc_paused
from storyforge.engine.renderer import Program, RenderResult, build_slots, render
from storyforge.engine.schema import check_schema, describe_value, normalize
from storyforge.engine.sources import SourceSpec
from storyforge.engine.trace import SlotInfo

if TYPE_CHECKING:
    from storyforge.engine.budget import Estimator

__all__ = [
    "CACHE_SIZE",
    "CompiledTemplate",
    "Program",
    "clear_cache",
    "compile_template",
    "content_hash",
]

CACHE_SIZE = 256
"""How many compiled templates the process keeps (least recently used ones are dropped)."""

ArgChecker = Callable[[str, Any], Sequence[str]]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CompiledTemplate:
    """A validated, frozen template ready to render any number of times, from any thread.

    Equal (and hashing equal) to another compiled template with the same ``content_hash``:
    the sha256 of the canonical JSON of the document it was compiled from.
    """

    template: Template
    digest: _ContentHash
    bound_task: str | None = None
    allowed_sources: tuple[str, ...] | None = None
    notes: tuple[Issue, ...] = ()
    source: str | None = None
    program: Program = field(repr=False)

    @property
    def content_hash(self) -> str:
        """sha256 (hex) of the canonical JSON of the document (computed when first asked)."""
        return self.digest.value()

    @property
    def id(self) -> str:
        return self.template.id

    @property
    def name(self) -> str:
        return self.template.name

    @property
    def task(self) -> str:
        return self.template.task

    @property
    def version(self) -> int:
        return self.template.version

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompiledTemplate):
            return NotImplemented
        return self.content_hash == other.content_hash

    def __hash__(self) -> int:
        return hash(("CompiledTemplate", self.content_hash))

    def render(
        self,
        ctx: Mapping[str, Any] | None,
        registry: Mapping[str, Any] | None = None,
        budget: int | None = None,
        estimator: Estimator | None = None,
    ) -> RenderResult:
        """Same as :func:`storyforge.render` with this template."""
        return render(self, ctx, registry, budget=budget, estimator=estimator)


# -- content hash --------------------------------------------------------------------------------


def _canonical_json(document: Any) -> str:
    return json.dumps(
        document,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=True,
        default=lambda o: f"<{type(o).__name__}>",
    )


def content_hash(template: Any) -> str:
    """sha256 (hex) of the canonical JSON (sorted keys, compact) of a template document."""
    if isinstance(template, LoadedTemplate):
        template = template.data
    document, _ = normalize(template)
    return hashlib.sha256(_canonical_json(document).encode("utf-8")).hexdigest()


def _refuse_assignment(self: object, name: str, value: object = None) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


# Frozen for every name, properties included (the generated check does not cover those on a
# class with slots).
CompiledTemplate.__setattr__ = _refuse_assignment  # type: ignore[method-assign]
CompiledTemplate.__delattr__ = _refuse_assignment  # type: ignore[method-assign]


@dataclass(frozen=True, slots=True, eq=False)
class _ContentHash:
    """A template's content hash, worked out when first asked: compiling keeps the document
    as compact ``marshal`` bytes (already made for the cache key) and drops them once the
    hash is known, so a template that is only rendered never serialises canonical JSON.
    Frozen from outside; :meth:`value` alone fills in the digest (always the same one)."""

    packed: bytes = field(repr=False)
    digest: str | None = None

    def value(self) -> str:
        packed = self.packed  # read first: another thread sets the digest before dropping these
        digest = self.digest
        if digest is None:
            digest = hashlib.sha256(
                _canonical_json(marshal.loads(packed)).encode("utf-8", "surrogatepass")
            ).hexdigest()
            object.__setattr__(self, "digest", digest)
            object.__setattr__(self, "packed", b"")
        return digest

    def __repr__(self) -> str:
        return repr(self.value())


# -- cache ---------------------------------------------------------------------------------------

_CACHE: OrderedDict[Any, CompiledTemplate] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forget every cached compiled template."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _cache_get(key: Any) -> CompiledTemplate | None:
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
        return hit


def _cache_put(key: Any, value: CompiledTemplate) -> None:
    with _CACHE_LOCK:
        _CACHE[key] = value
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)


def _specs_key(specs: Sequence[SourceSpec] | None) -> Any:
    if specs is None:
        return None
    return tuple((s.name, tuple(sorted(s.args))) for s in specs)


# -- compile -------------------------------------------------------------------------------------


def compile_template(
    template: Mapping[str, Any] | LoadedTemplate,
    *,
    task: str | None = None,
    allowed_sources: Sequence[str] | None = None,
    source_specs: Sequence[SourceSpec] | None = None,
    check_args: ArgChecker | None = None,
    name: str | None = None,
) -> CompiledTemplate:
    """Validate and compile ``template``; raise one :class:`TemplateValidationError` with every issue.

    ``task``: the template's ``task`` must equal it (unchecked when ``None``).
    ``allowed_sources``: turns source-name linting on (an empty list allows only the
    reserved sources); defaults to the names in ``source_specs`` when those are given.
    ``source_specs``: also lints DataRef argument names. ``check_args(source, args)``
    returns the problems with one DataRef's args (a task kind's ``check_args``).
    ``name`` labels the error (default: the template's ``name``).
    """
    with gc_paused():  # linear time in the size of the template (see gc_paused)
        return _compile(template, task, allowed_sources, source_specs, check_args, name)


def _compile(
    template: Mapping[str, Any] | LoadedTemplate,
    task: str | None,
    allowed_sources: Sequence[str] | None,
    source_specs: Sequence[SourceSpec] | None,
    check_args: ArgChecker | None,
    name: str | None,
) -> CompiledTemplate:
    loaded = template if isinstance(template, LoadedTemplate) else None
    raw = loaded.data if loaded is not None else template
    if isinstance(allowed_sources, str):
        raise TypeError("allowed_sources must be a list of source names, not a string")
    if allowed_sources is None and source_specs is not None:
        allowed_sources = [s.name for s in source_specs]
    allowed = tuple(allowed_sources) if allowed_sources is not None else None

    document, issues = normalize(raw)
    # The cache key is the document's exact marshal image (dict order and value types included:
    # equal bytes mean an equal document); the canonical-JSON content hash is made only when
    # someone asks for it (CompiledTemplate.content_hash).
    packed = marshal.dumps(document, _MARSHAL_VERSION)  # plain data at most MAX_DEPTH deep: always marshals
    key = _cache_key(packed, task, allowed, source_specs, check_args, loaded)
    if key is not None and not issues:
        hit = _cache_get(key)
        if hit is not None:
            return hit

    if not isinstance(document, Mapping):
        issues.append(
            Issue(
                code="schema",
                path=TemplatePath(),
                message=f"expected a mapping, found {describe_value(document)}",
            )
        )
        document = {}
    issues.extend(check_schema(document))
    issues.extend(check_task(document, task))

    parts = collect(document)
    leaves: dict[TemplatePath, LeafLike] = {}
    for path, text in parts.leaves:
        try:
            leaves[path] = compile_leaf(text, path)
        except TemplateValidationError as exc:
            issues.extend(exc.issues)
    conditions: dict[TemplatePath, ConditionLike] = {}
    refs: list[RefSite] = list(parts.refs)
    for path, spec in parts.conditions:
        try:
            condition = compile_condition(spec, path)  # freezes a mapping itself
        except TemplateValidationError as exc:
            issues.extend(exc.issues)
            continue
        conditions[path] = condition
        if isinstance(spec, str):  # structured refs were collected with their own paths
            for source, args in condition.refs():
                refs.append(RefSite(path=path, source=source, args=args, has_args=args is not None))
    issues.extend(lint_sources(refs, allowed, source_specs))
    if check_args is not None:
        issues.extend(_check_args(refs, check_args, allowed))
    issues.extend(check_structure(document, parts))

    label = name or (document.get("name") if isinstance(document.get("name"), str) else None)
    if issues:
        if loaded is not None:
            issues = [_locate(i, loaded) for i in issues]
        raise TemplateValidationError(issues, template_name=label, source=loaded.source if loaded else None)

    model = build_template(document, leaves, conditions)
    return _finish(model, tuple(notes(document, parts)), packed, key, task, allowed, loaded)


# Version 2 writes no back-references, so the bytes depend on the data alone (not on which
# objects happen to be shared): the caller's plain document and its normalised copy give the
# same image, and so the same cache key.
_MARSHAL_VERSION = 2


def _cache_key(
    packed: bytes,
    task: str | None,
    allowed: tuple[str, ...] | None,
    source_specs: Sequence[SourceSpec] | None,
    check_args: ArgChecker | None,
    loaded: LoadedTemplate | None,
) -> Any:
    # The image itself, not a digest of it: hashing the bytes is several times cheaper than
    # SHA-256 (a tenth of compiling a small template), a hit compares them exactly, and the
    # compiled template keeps the same bytes object for its content hash anyway.
    key: Any = (
        packed,
        task,
        allowed,
        _specs_key(source_specs),
        check_args,
        loaded.source if loaded else None,
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _finish(
    model: Template,
    found_notes: tuple[Issue, ...],
    packed: bytes,
    key: Any,
    task: str | None,
    allowed: tuple[str, ...] | None,
    loaded: LoadedTemplate | None,
) -> CompiledTemplate:
    """The compiled template of a valid ``model`` (cached under ``key``)."""
    slots = build_slots(model)
    shown = {node.name for node in model.layout if isinstance(node, LayoutSlot)}
    slot_info = tuple(SlotInfo(name=p.name, priority=p.priority, in_layout=p.name in shown) for p in slots)
    program = Program(slots=slots, layout=build_layout(model), slot_info=slot_info)
    compiled = CompiledTemplate(
        template=model,
        digest=_ContentHash(packed=packed),
        bound_task=task,
        allowed_sources=allowed,
        notes=found_notes,
        source=loaded.source if loaded else None,
        program=program,
    )
    if key is not None:
        _cache_put(key, compiled)
    return compiled


def _check_args(refs: Sequence[RefSite], check: ArgChecker, allowed: tuple[str, ...] | None) -> list[Issue]:
    out: list[Issue] = []
    for site in refs:
        if site.source.startswith("$") or (allowed is not None and site.source not in allowed):
            continue
        try:
            problems = check(site.source, site.args)
        except Exception as exc:  # noqa: BLE001 - a broken checker must not hide the template's issues
            problems = [f"argument check failed: {exc}"]
        for problem in problems:
            out.append(
                Issue(
                    code="bad_args",
                    path=site.path / "args" if site.has_args else site.path,
                    message=str(problem),
                )
            )
    return out


def _locate(issue: Issue, loaded: LoadedTemplate) -> Issue:
    pos = loaded.locate(issue.path)
    if pos is None:
        return issue
    return replace(issue, message=f"{issue.message} ({loaded.source}:{pos[0]})")
