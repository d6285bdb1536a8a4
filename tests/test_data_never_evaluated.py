"""Data is never evaluated: strings from the context expand by the reference path rules only.

A value that holds ``{{`` is rendered again against the same scope (§5.5), but every
placeholder in it is a plain path: operators, filters, reserved names (``$ctx``) and
``{{#if}}`` blocks written into data are paths that do not resolve, so a chat turn that
says ``{{$ctx}}`` cannot show the hidden context.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import param

from storyforge import compile_template, render


def _template(content: str, *, loop: bool = False) -> dict[str, Any]:
    if loop:
        plan = [
            {
                "kind": "forEach",
                "source": {"source": "$ctx", "args": {"path": "turns"}},
                "map": [{"kind": "message", "role": "user", "content": content}],
            }
        ]
        return {
            "id": "t",
            "name": "t",
            "task": "x",
            "version": 1,
            "layout": [{"kind": "slot", "name": "s"}],
            "slots": {"s": {"priority": 0, "plan": plan}},
        }
    return {
        "id": "t",
        "name": "t",
        "task": "x",
        "version": 1,
        "layout": [{"kind": "message", "role": "user", "content": content}],
        "slots": {},
    }


def _text(content: str, ctx: dict[str, Any], *, loop: bool = False) -> str:
    messages = render(compile_template(_template(content, loop=loop)), ctx).messages
    return "\n".join(m["content"] for m in messages)


SECRET = {"api_key": "sk-hidden"}

CASES = [
    param(
        "{{a}}|{{c}}|{{d}}",
        {"a": "{{ x == 1 }}", "c": "{{not a variable}}", "d": "{{$ctx}}", "x": 1},
        "||",
        id="issue-case",
    ),
    param("[{{t}}]", {"t": "{{$ctx}}", "secret": SECRET}, "[]", id="ctx-reserved-name"),
    param("[{{t}}]", {"t": "{{ $ctx.secret }}", "secret": SECRET}, "[]", id="reserved-with-path"),
    param("[{{t}}]", {"t": "{{ secret | json }}", "secret": SECRET}, "[]", id="filter"),
    param("[{{t}}]", {"t": "{{ len(secret) }}", "secret": SECRET}, "[]", id="function-call"),
    param("[{{t}}]", {"t": "{{#if x}}yes{{else}}no{{/if}}", "x": 1}, "[yesno]", id="if-block-tags-are-paths"),
    param("[{{t}}]", {"t": "{{#if x}}yes{{/if}}", "#if x": "Q"}, "[Qyes]", id="tag-text-is-a-key"),
    param("[{{t}}]", {"t": '{{ "lit" }}'}, "[]", id="string-literal"),
    param("[{{t}}]", {"t": "{{ 1 + 1 }}"}, "[]", id="arithmetic"),
    param("[{{t}}]", {"t": "{{ x or 'y' }}", "x": 0}, "[]", id="boolean-operator"),
    param("[{{t}}]", {"t": "{{ name }}", "name": "Ann"}, "[Ann]", id="plain-path-expands"),
    param("[{{t}}]", {"t": "{{ who.name }}", "who": {"name": "Ann"}}, "[Ann]", id="dotted-path-expands"),
    param("[{{t}}]", {"t": "{{ secret }}", "secret": SECRET}, "[]", id="path-to-object"),
    param("[{{t}}]", {"t": "{{ctx}}", "secret": SECRET}, "[]", id="ctx-itself"),
    param("[{{t}}]", {"t": "{{globals}}", "globals": {"k": "v"}}, "[]", id="globals-itself"),
    param("[{{t}}]", {"t": "{{hero}}", "hero": {"secret": "s"}}, "[]", id="a-character-object"),
    param("[{{t}}]", {"t": "{{ tags }}", "tags": ["a", "b"]}, "[]", id="path-to-list"),
    param(
        "[{{t}}]", {"t": "{{ ctx.secret.api_key }}", "secret": SECRET}, "[sk-hidden]", id="scalar-in-object"
    ),
    param("[{{t}}]", {"t": "{{n}} {{b}} {{z}}", "n": 2.5, "b": True, "z": None}, "[2.5 true ]", id="scalars"),
    param("[{{t}}]", {"t": "{{my key}}", "my key": "sp"}, "[sp]", id="spaced-key"),
    param("[{{t}}]", {"t": "{{ }}"}, "[]", id="empty-path"),
    param("[{{t}}]", {"t": "{{t}}"}, "[{{t}}]", id="self-reference-capped"),
    param("[{{ t | upper }}]", {"t": "{{ $ctx }}", "x": "v"}, "[]", id="before-a-filter"),
    param("[{{ t or 'n' }}]", {"t": "{{x == 1}}", "x": 1}, "[]", id="inside-an-expression"),
    param("[{{#if t}}{{t}}{{/if}}]", {"t": "{{$ctx}}", "k": "v"}, "[]", id="inside-an-if-block"),
]


@pytest.mark.parametrize(("content", "ctx", "expected"), CASES)
def test_data_is_expanded_by_path_rules_only(content: str, ctx: dict[str, Any], expected: str) -> None:
    """Text from data renders with the reference's recursive-expansion rules, never as an expression."""
    assert _text(content, ctx) == expected


def test_chat_turn_cannot_read_the_hidden_context() -> None:
    """A history turn typed as ``{{$ctx}}`` renders empty inside a forEach."""
    ctx = {"turns": [{"text": "{{$ctx}}"}, {"text": "{{ $item }}"}, {"text": "hi {{ turns }}"}], "key": "sk"}
    out = render(compile_template(_template("<{{item.text}}>", loop=True)), ctx).messages
    assert out[0]["content"].split("\n")[:2] == ["<>", "<>"]
    assert out[0]["content"].split("\n")[2] == "<hi >"


def test_object_reached_from_data_warns_without_showing_it() -> None:
    """A data path reaching a mapping renders empty with one warning that names the path, not the value."""
    result = render(compile_template(_template("[{{t}}] [{{t}}]")), {"t": "{{ctx}}", "key": "sk-hidden"})
    assert result.messages[0]["content"] == "[] []"
    message = (
        "a placeholder in data, {{ctx}}, reached a mapping or list and rendered empty: "
        "data expands to strings, numbers and booleans only"
    )
    assert result.warnings == [message]
    assert "sk-hidden" not in json.dumps(result.trace.to_dict())


def test_the_template_itself_still_renders_objects_as_json() -> None:
    """Only values reached from data are limited to scalars: the template's own {{secret}} is JSON."""
    assert _text("{{secret}}", {"secret": SECRET}) == '{"api_key":"sk-hidden"}'


@pytest.mark.parametrize(
    ("mode", "expected"),
    [param("paths", "[Ann|]", id="paths"), param("off", "[{{name}}|{{ctx}}]", id="off")],
)
def test_data_expansion_setting(mode: str, expected: str) -> None:
    """``data_expansion: off`` inserts data strings as they are; ``paths`` expands them to scalars."""
    from storyforge import SourceRegistry

    compiled = compile_template(_template("[{{a}}|{{b}}]"))
    ctx = {"a": "{{name}}", "b": "{{ctx}}", "name": "Ann"}
    registry = SourceRegistry({}, data_expansion=mode)
    assert render(compiled, ctx, registry).messages[0]["content"] == expected


def test_data_expansion_is_set_per_task_kind() -> None:
    """A task kind's ``data_expansion`` reaches every registry it builds."""
    import dataclasses

    from storyforge.tasks.base import get_task_kind

    kind = dataclasses.replace(get_task_kind("turn_generation"), data_expansion="off")
    assert kind.registry({}).data_expansion == "off"
    assert get_task_kind("turn_generation").registry({}).data_expansion == "paths"


def test_data_expansion_refuses_unknown_modes() -> None:
    """A registry only takes the documented modes."""
    from storyforge import SourceRegistry

    with pytest.raises(ValueError, match="'paths' or 'off'"):
        SourceRegistry({}, data_expansion="all")


# -- property: any string in data renders as the reference's rules say --------------------------

_PLACEHOLDER = re.compile(r"\{\{([^{}]+)}}")
_JS_WS = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _oracle_segments(path: str) -> list[str]:
    segments, current, i = [], "", 0
    while i < len(path):
        ch = path[i]
        if ch == ".":
            if current:
                segments.append(current)
            current = ""
        elif ch == "[" and "]" in path[i + 1 :]:
            if current:
                segments.append(current)
            current = ""
            close = path.index("]", i + 1)
            segments.append(path[i + 1 : close])
            i = close
        else:
            current += ch
        i += 1
    if current:
        segments.append(current)
    return segments


def _oracle_walk(value: Any, segments: list[str]) -> tuple[bool, Any]:
    for segment in segments:
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment == "length":
            value = len(value)
        elif (
            isinstance(value, list) and re.fullmatch(r"0|[1-9][0-9]*", segment) and int(segment) < len(value)
        ):
            value = value[int(segment)]
        else:
            return False, None
    return True, value


def _oracle(text: str, ctx: dict[str, Any], depth: int) -> str:
    """An independent model of §5.4-§5.5 for contexts of strings, ints and dicts."""

    def replace(match: re.Match[str]) -> str:
        segments = _oracle_segments(match.group(1).strip(_JS_WS))
        if not segments:
            return ""
        scope = {"ctx": ctx, **ctx, "item": None}
        found, value = _oracle_walk(scope, segments)
        if not found:
            found, value = _oracle_walk(ctx.get("globals"), segments)
        if not found or value is None:
            return ""
        if isinstance(value, str):
            if "{{" in value and depth < 5:
                return _oracle(value, ctx, depth + 1)
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    return _PLACEHOLDER.sub(replace, text)


_FRAGMENTS = st.sampled_from(
    [
        "{{",
        "}}",
        "{",
        "}",
        " ",
        "$ctx",
        "$item",
        "x",
        "name",
        "secret",
        "t",
        "==",
        "1",
        "|",
        "upper",
        "json",
        "#if ",
        "/if",
        "else",
        "not ",
        " and ",
        "(",
        ")",
        '"',
        "'",
        "[",
        "]",
        ".",
        "length",
        "-",
    ]
)
data_strings = st.lists(st.one_of(_FRAGMENTS, st.text(max_size=3)), max_size=14).map("".join)


@settings(max_examples=300, deadline=None)
@given(first=data_strings, second=data_strings)
def test_any_data_string_renders_by_reference_rules(first: str, second: str) -> None:
    """Whatever string sits in the context, ``{{t}}`` renders exactly as the reference path rules say."""
    ctx = {"t": first, "u": second, "x": 1, "name": "Ann", "secret": {"k": "hidden", "l": [1, 2]}}
    assert _text("{{t}}", ctx) == _oracle("{{t}}", ctx, 0)
