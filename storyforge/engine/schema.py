"""Shape checks for template documents: plain-data normalisation, then JSON Schema.

Takes: a template as any JSON-like mapping (``dict``, YAML-loaded data; a composed config is
made plain data by :mod:`storyforge.config` before it reaches the engine). Gives: :func:`normalize` (a deep, plain ``dict``/``list`` copy plus issues
for things no JSON document can hold: non-string keys, sets, objects, nesting past
:data:`MAX_DEPTH`, cycles) and :func:`check_schema` (every JSON Schema violation as an
:class:`~storyforge.engine.errors.Issue` whose path comes from ``error.absolute_path``).

Why: the schema (``schemas/template.v1.json``, Draft 2020-12, shipped in the package) is the
single statement of the DSL's shape; jsonschema reports every violation in one pass, and this
module rewrites its messages into sentences that say what was expected and what was found.
The validator is compiled once per process.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # jsonschema is imported only to explain an invalid document
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

from storyforge.engine.errors import Issue, TemplatePath

__all__ = ["MAX_DEPTH", "check_schema", "describe_value", "normalize", "template_schema"]

MAX_DEPTH = 64
"""Deepest container nesting a template may have (plan nodes nest two levels per step)."""

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


@cache
def template_schema() -> dict[str, Any]:
    """The v1 template JSON Schema as a dict (loaded once from the package)."""
    text = resources.files("storyforge.engine").joinpath("schemas/template.v1.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator() -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    schema = template_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def describe_value(value: Any) -> str:
    """A short, readable description of a found value: ``the string 'bot'``, ``1.5``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def _check_text(text: str) -> tuple[str, str | None]:
    """``(text, problem)``: a string that is valid Unicode, with ``problem`` describing the first
    lone surrogate it had (replaced by U+FFFD so later checks still see a string). A surrogate
    *pair* is a valid character written in two halves and is joined, not reported."""
    try:
        text.encode("utf-8")
        return text, None
    except UnicodeEncodeError as exc:
        try:
            return text.encode("utf-16", "surrogatepass").decode("utf-16"), None
        except UnicodeDecodeError:
            pass
        code = ord(text[exc.start])
        problem = (
            f"contains a lone surrogate (U+{code:04X}) at character {exc.start + 1}, which is not "
            "valid Unicode text; remove it or write the whole character"
        )
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), problem


class _NotPlain(Exception):
    """Raised by :func:`_plain_copy` on anything the quick copy does not handle."""


def _plain_copy(value: Any, depth: int) -> Any:
    """A deep copy of plain JSON data made of exact ``dict``, ``list`` and scalar types, with
    string keys and valid text, at most :data:`MAX_DEPTH` levels deep; raises
    :class:`_NotPlain` on anything else (which :func:`normalize` then walks the careful way).
    Recursion is bounded by the depth limit (a cycle exceeds it too)."""
    kind = value.__class__
    if kind is str:
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _NotPlain from None
        return value
    if kind is dict:
        if depth >= MAX_DEPTH:
            raise _NotPlain
        out = {}
        for k, v in value.items():
            if k.__class__ is not str or not k.isascii():
                raise _NotPlain
            cls = v.__class__
            # ASCII strings, ints and booleans are copied as they are without a call
            out[k] = (
                v if (cls is str and v.isascii()) or cls is int or cls is bool else _plain_copy(v, depth + 1)
            )
        return out
    if kind is list:
        if depth >= MAX_DEPTH:
            raise _NotPlain
        return [_plain_copy(v, depth + 1) for v in value]
    if value is None or kind is int or kind is bool or kind is float:
        return value
    raise _NotPlain


def normalize(template: Any) -> tuple[Any, list[Issue]]:
    """Deep-copy ``template`` into plain JSON data (dict/list/str/int/float/bool/None).

    Any mapping becomes a ``dict`` and any non-string sequence a ``list``, so the caller's
    objects are never shared with what is compiled. Values JSON cannot hold are reported
    (and replaced by ``None``); so are non-string keys, cycles and nesting deeper than
    :data:`MAX_DEPTH`. Iterative, so hostile nesting cannot exhaust the Python stack.
    Documents that are already plain data (parsed JSON or YAML) take a quick recursive copy
    bounded by the same depth limit, with the same result.
    """
    try:
        return _plain_copy(template, 0), []
    except _NotPlain:
        pass
    except RecursionError:  # pragma: no cover - the depth limit keeps well inside the stack
        pass
    issues: list[Issue] = []
    root: list[Any] = [None]
    # Work items: (source value, container to store into, key in that container, path, depth, ancestors)
    stack: list[tuple[Any, Any, Any, TemplatePath, int, frozenset[int]]] = [
        (template, root, 0, TemplatePath(), 0, frozenset())
    ]
    while stack:
        value, parent, key, path, depth, ancestors = stack.pop()
        if isinstance(value, str) and not value.isascii():
            value, problem = _check_text(value)
            if problem is not None:
                issues.append(Issue(code="encoding", path=path, message=problem))
        if value is None or isinstance(value, str | bool | int):
            parent[key] = value
            continue
        if isinstance(value, float):
            parent[key] = value
            continue
        if isinstance(value, Mapping | list | tuple) or (
            isinstance(value, Sequence) and not isinstance(value, bytes | bytearray)
        ):
            if id(value) in ancestors:
                issues.append(Issue(code="schema", path=path, message="a value contains itself (cycle)"))
                parent[key] = None
                continue
            if depth >= MAX_DEPTH:
                issues.append(
                    Issue(
                        code="too_deep",
                        path=path,
                        message=f"nested too deeply: at most {MAX_DEPTH} levels of mappings and lists",
                    )
                )
                parent[key] = None
                continue
            inner = ancestors | {id(value)}
            if isinstance(value, Mapping):
                out: dict[str, Any] = {}
                parent[key] = out
                try:
                    items = list(value.items())
                except Exception as exc:  # noqa: BLE001 - a mapping type whose items() raises
                    issues.append(Issue(code="schema", path=path, message=f"cannot read this mapping: {exc}"))
                    continue
                children: list[tuple[str, Any]] = []
                for k, v in items:
                    if isinstance(k, str) and not k.isascii():
                        shown = repr(k)
                        k, problem = _check_text(k)
                        if problem is not None:
                            issues.append(
                                Issue(code="encoding", path=path, message=f"the key {shown} {problem}")
                            )
                    if not isinstance(k, str):
                        issues.append(
                            Issue(
                                code="schema",
                                path=path,
                                message=f"mapping keys must be strings, found the key {k!r}",
                            )
                        )
                        continue
                    out[k] = None  # reserve the author's key order; the value is filled below
                    children.append((k, v))
                for k, v in reversed(children):
                    stack.append((v, out, k, path / k, depth + 1, inner))
            else:
                seq = list(value)
                lst: list[Any] = [None] * len(seq)
                parent[key] = lst
                for i in range(len(seq) - 1, -1, -1):
                    stack.append((seq[i], lst, i, path / i, depth + 1, inner))
            continue
        issues.append(
            Issue(
                code="schema",
                path=path,
                message=f"expected JSON-like data (mapping, list, string, number, boolean, null), "
                f"found {describe_value(value)}",
            )
        )
        parent[key] = None
    return root[0], issues


def _draft7(node: Any) -> Any:
    """The schema in draft-07 terms: ``$ref`` with sibling keywords becomes an ``allOf`` (in
    draft-07 the siblings of ``$ref`` are ignored; in 2020-12 they apply)."""
    if isinstance(node, Mapping):
        out = {k: _draft7(v) for k, v in node.items()}
        siblings = {k: v for k, v in out.items() if k not in ("$ref", "description", "title")}
        if "$ref" in out and siblings:
            return {"allOf": [{"$ref": out["$ref"]}, siblings]}
        return out
    if isinstance(node, list):
        return [_draft7(v) for v in node]
    return node


@cache
def _fast_validator() -> Callable[[Any], Any] | None:
    """A validator compiled to Python by fastjsonschema from our own schema file (never from
    template text), or ``None`` when the package is missing. It answers valid / invalid about
    ten times faster than jsonschema; jsonschema then explains an invalid document."""
    try:
        import fastjsonschema
    except ImportError:  # pragma: no cover - a core dependency, but the engine works without it
        return None
    schema = _draft7(template_schema())
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return fastjsonschema.compile(schema)


def _accepts(validate: Callable[[Any], Any], document: Any) -> bool:
    try:
        validate(document)
    except Exception:  # noqa: BLE001 - invalid (or an unusual value): jsonschema says why
        return False
    return True


# -- a hand-written check of the same schema, for the common case -------------------------------
#
# Each function answers True only when the value satisfies the matching definition of
# schemas/template.v1.json; it may answer False for a value the schema accepts (an integer
# written as 2.0, say), which then simply takes the validators' path. So it never accepts a
# document the schema refuses, and tests/test_schema.py checks that on generated documents.

# tuples, not sets: membership by equality, so an unhashable value is simply not in them
_ROLES = "system", "user", "assistant"
_CONDITION_TYPES = "exists", "nonEmpty", "eq", "neq", "gt", "lt"


def _opt(node: dict[str, Any], key: str, kind: type) -> bool:
    value = node.get(key, _opt)
    return value is _opt or value.__class__ is kind


def _int_at_least(node: dict[str, Any], key: str, low: int, required: bool) -> bool:
    value = node.get(key, _opt)
    if value is _opt:
        return not required
    return value.__class__ is int and value >= low


def _ok_ref(ref: Any) -> bool:
    return ref.__class__ is dict and ref.get("source", 0).__class__ is str


def _ok_budget(budget: Any) -> bool:
    return budget.__class__ is dict and _int_at_least(budget, "maxTokens", 1, False)


def _ok_block(block: Any) -> bool:
    return (
        block.__class__ is dict
        and block.get("role") in _ROLES
        and _opt(block, "content", str)
        and ("from" not in block or _ok_ref(block["from"]))
        and _opt(block, "prefix", bool)
        and _opt(block, "skipIfEmptyInterpolation", bool)
    )


def _ok_blocks(value: Any) -> bool:
    if value.__class__ is list:
        return all(_ok_block(b) for b in value)
    return _ok_block(value)


def _ok_condition(when: Any) -> bool:
    if when.__class__ is dict:
        return when.get("type") in _CONDITION_TYPES and "ref" in when and _ok_ref(when["ref"])
    return when.__class__ is str


def _ok_plan(plan: Any) -> bool:
    return plan.__class__ is list and all(_ok_plan_node(n) for n in plan)


def _ok_plan_node(node: Any) -> bool:
    if node.__class__ is not dict:
        return False
    kind = node.get("kind")
    if kind == "message":
        return _ok_block(node) and ("budget" not in node or _ok_budget(node["budget"]))
    if kind == "forEach":
        interleave = node.get("interleave", _opt)
        return (
            "source" in node
            and _ok_ref(node["source"])
            and "map" in node
            and _ok_plan(node["map"])
            and node.get("order", "asc") in ("asc", "desc")
            and node.get("fillDir", "append") in ("append", "prepend")
            and _int_at_least(node, "limit", 1, False)
            and (
                interleave is _opt
                or (
                    interleave.__class__ is dict
                    and interleave.get("kind") == "separator"
                    and _opt(interleave, "text", str)
                )
            )
            and ("budget" not in node or _ok_budget(node["budget"]))
            and _opt(node, "stopWhenOutOfBudget", bool)
        )
    if kind == "if":
        return (
            "when" in node
            and _ok_condition(node["when"])
            and "then" in node
            and _ok_plan(node["then"])
            and ("else" not in node or _ok_plan(node["else"]))
        )
    return False


def _ok_layout_node(node: Any) -> bool:
    if node.__class__ is not dict:
        return False
    kind = node.get("kind")
    if kind == "message":
        return _ok_block(node) and _opt(node, "name", str)
    if kind == "slot":
        return (
            node.get("name", 0).__class__ is str
            and ("header" not in node or _ok_blocks(node["header"]))
            and ("footer" not in node or _ok_blocks(node["footer"]))
            and _opt(node, "omitIfEmpty", bool)
        )
    return False


def _ok_slot(slot: Any) -> bool:
    return (
        slot.__class__ is dict
        and _int_at_least(slot, "priority", 0, True)
        and "plan" in slot
        and _ok_plan(slot["plan"])
        and ("when" not in slot or _ok_condition(slot["when"]))
        and ("budget" not in slot or _ok_budget(slot["budget"]))
        and _opt(slot, "meta", dict)
    )


def plainly_valid(document: Any) -> bool:
    """True when ``document`` (normalised) surely satisfies the template schema; False when it
    does not or when only the full validators can tell."""
    if document.__class__ is not dict:
        return False
    version = document.get("version")
    layout = document.get("layout")
    slots = document.get("slots")
    return (
        document.get("id", 0).__class__ is str
        and document.get("name", 0).__class__ is str
        and document.get("task", 0).__class__ is str
        and _opt(document, "description", str)
        and version.__class__ is int
        and version == 1
        and layout.__class__ is list
        and all(_ok_layout_node(n) for n in layout)
        and slots.__class__ is dict
        and all(_ok_slot(s) for s in slots.values())
    )


def check_schema(document: Any) -> list[Issue]:
    """Every JSON Schema violation of ``document`` (already normalised) as an issue.

    A valid document is recognised by a hand-written check of the same schema
    (:func:`plainly_valid`), or else by the compiled validator alone; only an invalid one goes
    through jsonschema, whose errors carry the paths and wording of the issues.
    """
    try:
        if plainly_valid(document):
            return []
    except RecursionError:  # pragma: no cover - normalised documents are at most MAX_DEPTH deep
        pass
    fast = _fast_validator()
    if fast is not None and _accepts(fast, document):
        return []
    issues: list[Issue] = []
    for error in _validator().iter_errors(document):
        issues.append(_to_issue(error))
    return issues


def _to_issue(error: ValidationError) -> Issue:
    path = TemplatePath(p for p in error.absolute_path if isinstance(p, str | int))
    return Issue(code="schema", path=path, message=_message(error, path))


def _message(error: ValidationError, path: TemplatePath) -> str:
    v = error.validator
    found = error.instance
    schema: Any = error.schema
    if v == "required":
        missing = _missing_key(error)
        return f"missing required key {missing!r}" if missing else error.message
    if v == "type":
        if path and path[-1] == "when":
            return (
                "expected a condition: a mapping with 'type' and 'ref', or an expression string; "
                f"found {describe_value(found)}"
            )
        if path and path[-1] in ("header", "footer"):
            return (
                "expected a message block (a mapping with 'role') or a list of them; "
                f"found {describe_value(found)}"
            )
        wanted = schema.get("type") if isinstance(schema, Mapping) else None
        words = _TYPE_WORDS.get(wanted, str(wanted)) if isinstance(wanted, str) else "another type"
        return f"expected {words}, found {describe_value(found)}"
    if v == "enum":
        options = list(schema.get("enum", ())) if isinstance(schema, Mapping) else []
        listed = ", ".join(repr(o) for o in options)
        text = f"expected one of {listed}; found {describe_value(found)}"
        if isinstance(found, str):
            close = difflib.get_close_matches(found, [o for o in options if isinstance(o, str)], n=1)
            if close:
                text += f". Did you mean {close[0]!r}?"
        return text
    if v == "const":
        wanted = schema.get("const") if isinstance(schema, Mapping) else None
        if path == TemplatePath(("version",)):
            return f"expected version 1 (the only DSL version), found {describe_value(found)}"
        return f"expected {json.dumps(wanted)}, found {describe_value(found)}"
    if v == "minimum":
        low = schema.get("minimum") if isinstance(schema, Mapping) else None
        return f"expected an integer >= {low}, found {describe_value(found)}"
    return str(error.message)


def _missing_key(error: ValidationError) -> str | None:
    # jsonschema's message is "'x' is a required property"; recover the name robustly.
    required = error.validator_value
    instance = error.instance
    if isinstance(required, list) and isinstance(instance, Mapping):
        for name in required:
            if name not in instance:
                return str(name)
    return None
