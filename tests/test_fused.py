"""The one-walk compile (storyforge.engine.fused) gives exactly what the separate stages give.

For generated templates (storyforge/testing/template_strategies.py), the same templates with
random edits (wrong types, data JSON cannot hold, bad text, misspelt and unknown keys, broken
leaves and conditions, deep nesting) and hand-picked cases, compiling with the one-walk path
on and off must give the same compiled template (the model with every path, leaf and
condition, notes, content hash, slot info) or the same error (every issue with its code, path
and message). Valid generated templates must take the one walk, or the comparison proves
nothing.
"""

from __future__ import annotations

import copy
import dataclasses
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from template_strategies import places, templates

from storyforge import SourceSpec, TemplateValidationError, compile_template
from storyforge.engine import compiler
from storyforge.engine.errors import TemplatePath
from storyforge.engine.fused import compile_plain
from storyforge.engine.nodes import Condition, Leaf
from storyforge.engine.schema import MAX_DEPTH


def shape(value: Any) -> Any:
    """Everything about a compiled value, as nested tuples: field names, types and paths
    included (dataclass equality leaves paths, leaves and conditions out)."""
    if isinstance(value, Leaf | Condition):
        return (type(value).__name__, value)  # their own equality: source and parsed form
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple((f.name, shape(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    if isinstance(value, dict | MappingProxyType):
        return (type(value).__name__, tuple((k, shape(v)) for k, v in value.items()))
    if isinstance(value, TemplatePath):
        return ("path", tuple(value))
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(shape(v) for v in value))
    return (type(value).__name__, value)


def outcome(doc: Any, fused: bool, **options: Any) -> Any:
    compiler.FUSED = fused
    compiler.clear_cache()
    try:
        compiled = compile_template(doc, **options)
    except TemplateValidationError as exc:
        return "error", exc.template_name, [(i.code, tuple(i.path), i.message) for i in exc.issues]
    finally:
        compiler.FUSED = True
        compiler.clear_cache()
    program = compiled.program
    return (
        "compiled",
        shape(compiled.template),
        shape(compiled.notes),
        compiled.content_hash,
        compiled.bound_task,
        compiled.allowed_sources,
        shape(program.slot_info),
        [type(s).__name__ for s in program.slots],
    )


def same_both_ways(doc: Any, **options: Any) -> Any:
    before = copy.deepcopy(doc) if not _cyclic(doc) else None
    fast = outcome(doc, True, **options)
    if before is not None:
        assert doc == before  # neither way changes the caller's document
    assert fast == outcome(doc, False, **options)
    return fast


def _cyclic(doc: Any) -> bool:
    return isinstance(doc, dict) and any(v is doc for v in doc.values())


def _bad_args(source: str, args: Any) -> list[str]:
    return ["limit must be small"] if isinstance(args, dict) and args.get("limit", 0) > 5 else []


OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "task": st.sampled_from(["prop", "other"]),
        "allowed_sources": st.sampled_from([[], ["xs", "objs", "text", "num", "none", "bad"], ["xs"]]),
        "source_specs": st.just(
            [
                SourceSpec(name="xs", returns="list", args={"limit": "int"}),
                SourceSpec(name="objs", returns="list"),
            ]
        ),
        "check_args": st.just(_bad_args),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=templates(), options=OPTIONS)
def test_generated_templates_compile_the_same_both_ways(doc: Any, options: Any) -> None:
    """Valid generated templates take the one walk and come out as the separate stages make them."""
    assert compile_plain(doc, None, False) is not None
    same_both_ways(doc, **options)


# -- edits ----------------------------------------------------------------------------------------

ODD = st.sampled_from(
    [
        None,
        True,
        0,
        -1,
        2.0,
        "",
        "x",
        "user",
        "message",
        "slot",
        "forEach",
        "if",
        "{{",
        "{{#if}}",
        "a > ",
        'len(source("xs", {"limit": 9})) > 0',
        'source("objs") and not source("nowhere", [1])',
        "caf\u00e9",
        "lone \ud800 half",
        "\ud83d\ude00 pair in halves",
        [],
        [{"kind": "message", "role": "user"}],
        {},
        {"source": "xs"},
        {"source": "nowhere", "args": {"limit": 9, "zz": 1}},
        {"type": "exists", "ref": {"source": "xs"}},
        {"maxTokens": 3},
        {"role": "assistant", "prefix": True},
        {1: "int key"},
        {"k\u00e9y": 1},
        ("a", "tuple"),
        {"a", "set"},
        b"bytes",
        1j,
    ]
)
KEYS = st.sampled_from(
    [
        "kind",
        "role",
        "content",
        "contnet",
        "prefix",
        "budget",
        "maxTokens",
        "when",
        "priorty",
        "zzz",
        "k\u00e9y",
    ]
)


@st.composite
def edited_templates(draw: st.DrawFn) -> Any:
    doc = draw(templates())
    for _ in range(draw(st.integers(1, 3))):
        place = draw(st.sampled_from(places(doc)))
        target = doc
        for step in place:
            target = target[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if not place or action == "add":
            if isinstance(target, dict):
                target[draw(KEYS)] = copy.deepcopy(draw(ODD))
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), copy.deepcopy(draw(ODD)))
            continue
        parent = doc
        for step in place[:-1]:
            parent = parent[step]
        if action == "delete":
            del parent[place[-1]]
        else:
            parent[place[-1]] = copy.deepcopy(draw(ODD))
    return doc


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=edited_templates(), options=OPTIONS)
def test_edited_templates_compile_the_same_both_ways(doc: Any, options: Any) -> None:
    """Edited templates, valid or not, give the same compiled template or the same error both ways."""
    same_both_ways(doc, **options)


# -- chosen cases -----------------------------------------------------------------------------------


def base() -> dict[str, Any]:
    return {
        "id": "t",
        "name": "T",
        "task": "demo",
        "version": 1,
        "layout": [
            {"kind": "slot", "name": "s", "header": {"role": "user", "content": "Head"}},
            {"kind": "message", "role": "system", "content": "Hi {{name}}", "name": "greeting"},
        ],
        "slots": {
            "s": {
                "priority": 0,
                "budget": {"maxTokens": 50},
                "when": 'len(xs) > 0 and len(source("xs", {"limit": 2})) > 0',
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "xs", "args": {"limit": 2}},
                        "budget": {"maxTokens": 20},
                        "interleave": {"kind": "separator", "text": "--"},
                        "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                    },
                    {
                        "kind": "if",
                        "when": {"type": "eq", "ref": {"source": "num"}, "value": [1, {"a": None}]},
                        "then": [{"kind": "message", "role": "assistant", "content": "yes", "prefix": True}],
                    },
                ],
            }
        },
    }


def nested(depth: int, last: str = "message") -> dict[str, Any]:
    """``base()`` whose first plan holds forEach loops nested until the innermost node (a
    message with a ``from`` ref, or a loop over an empty map) sits ``depth`` levels down."""
    doc = base()
    plan: list[Any] = doc["slots"]["s"]["plan"]  # a list 3 levels down
    level = 3
    while level + 1 < depth:
        inner: list[Any] = []
        plan.append({"kind": "forEach", "source": {"source": "$item"}, "map": inner})
        plan, level = inner, level + 2
    if last == "message":
        plan.append({"kind": "message", "role": "user", "content": "deep", "from": {"source": "$item"}})
    else:
        plan.append({"kind": "forEach", "source": {"source": "$item"}, "map": []})
    return doc


def edit(change: Any) -> dict[str, Any]:
    doc = base()
    change(doc)
    return doc


def _slot(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["slots"]["s"]  # type: ignore[no-any-return]


def _loop(doc: dict[str, Any]) -> dict[str, Any]:
    return _slot(doc)["plan"][0]  # type: ignore[no-any-return]


FAST = [
    pytest.param(base(), id="base"),
    pytest.param(
        edit(lambda d: d.update(descriptoin="x", extra={"deep": [1, 2.5, None]})), id="misspelt-top-key"
    ),
    pytest.param(
        edit(lambda d: _loop(d)["map"][0].update(budget={"maxTokens": 30})), id="budget-above-parent"
    ),
    pytest.param(edit(lambda d: _loop(d).update(budget={"maxTokens": 99}, lmit=3)), id="loop-above-slot"),
    pytest.param(edit(lambda d: d["slots"].update(unused={"priority": 1, "plan": []})), id="unused-slot"),
    pytest.param(
        edit(lambda d: _slot(d).update(prority=2, meta={"x": [{"y": "z"}]})), id="misspelt-slot-key"
    ),
    pytest.param(edit(lambda d: d["layout"][0].update(nme="s", footer=[])), id="misspelt-layout-key"),
    pytest.param(edit(lambda d: d["layout"][1].update(content="")), id="empty-content"),
    pytest.param(edit(lambda d: d.update(name="caf\u00e9 \u2603")), id="non-ascii-text"),
    pytest.param(
        edit(lambda d: d["slots"].update({"sl\u00f6t": {"priority": 0, "plan": []}})), id="non-ascii-key"
    ),
    pytest.param(
        edit(lambda d: _loop(d).update(order="desc", fillDir="prepend", limit=1)), id="loop-options"
    ),
    pytest.param(nested(MAX_DEPTH - 2), id="ref-at-the-depth-limit"),
    pytest.param(nested(MAX_DEPTH - 2, "loop"), id="empty-plan-at-the-depth-limit"),
]


@pytest.mark.parametrize("doc", FAST)
def test_chosen_valid_templates_take_the_one_walk(doc: dict[str, Any]) -> None:
    assert compile_plain(doc, None, True) is not None
    result = same_both_ways(doc, allowed_sources=["xs", "num"], check_args=_bad_args)
    assert result[0] == "compiled"


_cycle: dict[str, Any] = base()
_cycle["self"] = _cycle

# (document, whether the one walk takes it, what compiling gives): the walk leaves source and
# argument linting to the compiler, which falls back to the separate stages when they object
SLOW = [
    pytest.param(edit(lambda d: d.update(layout=tuple(d["layout"]))), False, "compiled", id="tuple"),
    pytest.param(edit(lambda d: _slot(d).update(meta={"tags": {"a"}})), False, "error", id="set-in-meta"),
    pytest.param(
        edit(lambda d: d["layout"][1].update(content="lone \udc00")), False, "error", id="lone-surrogate"
    ),
    pytest.param(edit(lambda d: _slot(d).update(meta={1: "x"})), False, "error", id="int-key"),
    pytest.param(edit(lambda d: _slot(d).update(priority=1.0)), False, "compiled", id="float-priority"),
    pytest.param(edit(lambda d: _slot(d).update(priority=True)), False, "error", id="bool-priority"),
    pytest.param(
        edit(lambda d: d["layout"][1].update(content="{{#if x}}a")), False, "error", id="leaf-syntax"
    ),
    pytest.param(edit(lambda d: _slot(d).update(when="len(xs) >")), False, "error", id="condition-syntax"),
    pytest.param(
        edit(lambda d: _slot(d).update(when='source("xs", {"limit": 7})')),
        True,
        "error",
        id="bad-args-in-expression",
    ),
    pytest.param(edit(lambda d: d["layout"][0].update(name="t")), False, "error", id="missing-slot"),
    pytest.param(edit(lambda d: d["layout"][1].update(prefix=True)), False, "error", id="prefix-on-system"),
    pytest.param(
        edit(lambda d: _loop(d)["source"].update(source="nowhere")), True, "error", id="unknown-source"
    ),
    pytest.param(edit(lambda d: _loop(d)["source"]["args"].update(limit=9)), True, "error", id="bad-args"),
    pytest.param(edit(lambda d: d.update(task="other")), False, "error", id="task-mismatch"),
    pytest.param(edit(lambda d: _loop(d).update(order="up")), False, "error", id="bad-order"),
    pytest.param(edit(lambda d: _loop(d)["interleave"].update(kind="x")), False, "error", id="bad-separator"),
    pytest.param(edit(lambda d: _slot(d).update(meta={"x": nested(80)})), False, "error", id="too-deep-meta"),
    pytest.param(nested(MAX_DEPTH), False, "error", id="plan-past-the-depth-limit"),
    pytest.param(_cycle, False, "error", id="cycle"),
    pytest.param([base()], False, "error", id="not-a-mapping"),
    pytest.param(edit(lambda d: d["layout"][1].update(content="\ud83d\ude00")), False, "compiled", id="pair"),
    pytest.param(
        edit(lambda d: d["slots"].update({"\ud83d\ude00": {"priority": 0, "plan": []}})),
        False,
        "compiled",
        id="pair-in-a-key",
    ),
]


@pytest.mark.parametrize(("doc", "taken", "result"), SLOW)
def test_chosen_edits_compile_the_same_both_ways(doc: Any, taken: bool, result: str) -> None:
    """Whatever the one walk does not take, the separate stages handle as before: they report
    the faults, and normalise what they can (a tuple becomes a list, a character written as
    two surrogate halves is joined; the schema validators take 1.0 for an integer)."""
    assert (compile_plain(doc, "demo", True) is not None) == taken
    assert same_both_ways(doc, task="demo", allowed_sources=["xs", "num"], check_args=_bad_args)[0] == result


def test_check_args_gets_its_own_copy() -> None:
    """An argument checker sees an equal copy of the args, never the caller's objects."""
    doc = base()
    seen: list[Any] = []
    compile_template(doc, check_args=lambda source, args: seen.append(args) or [])
    args = _loop(doc)["source"]["args"]
    assert seen.count(args) == 2  # in the loop's source and in the slot's condition
    assert all(a is not args for a in seen)


def test_each_maker_builds_what_its_class_builds() -> None:
    """The one walk builds the model without the classes' generated __init__; each maker takes
    every field by name and gives an equal, equally frozen object with every field set."""
    from storyforge.engine import compiler, renderer
    from storyforge.engine.fused import MAKERS

    # and the makers of what the compiler builds around the model
    every = {**MAKERS, **compiler.MAKERS, renderer.SlotProgram: renderer._make_slot_program}
    for cls, make in every.items():
        values = {f.name: (f"{f.name}-value", i) for i, f in enumerate(dataclasses.fields(cls))}
        made = make(**values)
        built = cls(**values)
        assert type(made) is cls
        assert shape(made) == shape(built)
        assert all(getattr(made, name) is value for name, value in values.items())
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, next(iter(values)), None)
        with pytest.raises(TypeError):  # no field may be left out
            make(**dict(list(values.items())[1:]))
