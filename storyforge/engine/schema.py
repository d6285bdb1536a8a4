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

import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

from storyforge.engine.errors import Issue, TemplatePath, did_you_mean

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

    # the packaged schema is itself checked against the meta-schema by tests/test_schema.py
    return Draft202012Validator(template_schema())


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


def normalize(template: Any) -> tuple[Any, list[Issue]]:
    """Deep-copy ``template`` into plain JSON data (dict/list/str/int/float/bool/None).

    Any mapping becomes a ``dict`` and any non-string sequence a ``list``, so the caller's
    objects are never shared with what is compiled. Values JSON cannot hold are reported
    (and replaced by ``None``); so are non-string keys, cycles and nesting deeper than
    :data:`MAX_DEPTH`. Iterative, so hostile nesting cannot exhaust the Python stack.
    """
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


def check_schema(document: Any) -> list[Issue]:
    """Every JSON Schema violation of ``document`` (already normalised) as an issue.

    jsonschema's errors carry the paths; their wording is rewritten by :func:`_message`.
    """
    return [_to_issue(error) for error in _validator().iter_errors(document)]


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
            hint = did_you_mean(found, [o for o in options if isinstance(o, str)])
            if hint:
                text += f".{hint}"
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
