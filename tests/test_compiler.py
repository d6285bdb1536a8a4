"""compile_template: every stage's issues at once, deep copies, freezing, hashing, cache, loading."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest

from storyforge import (
    CompiledTemplate,
    SourceRegistry,
    SourceSpec,
    TemplateValidationError,
    compile_template,
    content_hash,
    render,
)
from storyforge.engine import compiler as compiler_module
from storyforge.engine.loader import load_template, load_template_text

ROOT = Path(__file__).resolve().parents[1]


def good() -> dict[str, Any]:
    return {
        "id": "demo",
        "name": "Demo",
        "task": "turn_generation",
        "version": 1,
        "description": "dropped",
        "layout": [
            {"kind": "message", "role": "system", "content": "You are {{name}}."},
            {"kind": "slot", "name": "history", "header": {"role": "user", "content": "History:"}},
        ],
        "slots": {
            "history": {
                "priority": 0,
                "meta": {"dropped": True},
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "turns", "args": {"limit": 2, "tags": ["a"]}},
                        "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                    }
                ],
                "when": {"type": "neq", "ref": {"source": "turns"}, "value": {"k": [1]}},
            }
        },
    }


def test_compiles_and_exposes_identity() -> None:
    """A good template compiles; id/name/task/version come from the document."""
    compiled = compile_template(good(), task="turn_generation", allowed_sources=["turns"])
    assert (compiled.id, compiled.name, compiled.task, compiled.version) == (
        "demo",
        "Demo",
        "turn_generation",
        1,
    )
    assert compiled.bound_task == "turn_generation"
    assert compiled.allowed_sources == ("turns",)


def test_every_stage_reported_in_one_error() -> None:
    """Schema, task, syntax, source and structure issues all come back in one error, sorted by path."""
    doc = good()
    doc["version"] = 2
    doc["layout"].append({"kind": "slot", "name": "histroy"})
    doc["layout"].append({"kind": "message", "role": "user", "prefix": True})
    doc["slots"]["history"]["plan"][0]["source"]["source"] = "turnz"
    doc["slots"]["history"]["plan"][0]["map"][0]["content"] = "{{#if item}}open"
    with pytest.raises(TemplateValidationError) as info:
        compile_template(doc, task="writing_assistant", allowed_sources=["turns"])
    found = {(i.code, str(i.path)) for i in info.value.issues}
    assert {
        ("schema", "version"),
        ("task_mismatch", "task"),
        ("missing_slot", "layout[2].name"),
        ("prefix_role", "layout[3].prefix"),
        ("unknown_source", "slots.history.plan[0].source"),
        ("syntax", "slots.history.plan[0].map[0].content"),
    } <= found
    paths = [str(i.path) for i in info.value.issues]
    assert paths.index("layout[2].name") < paths.index("slots.history.plan[0].source")
    assert "in template 'Demo'" in str(info.value)


def test_syntax_issue_has_line_and_column_inside_the_string() -> None:
    """A leaf syntax error names the string's path and the line/column inside it."""
    doc = good()
    doc["layout"][0]["content"] = "line one\nline two {{ name | }}"
    with pytest.raises(TemplateValidationError) as info:
        compile_template(doc)
    (issue,) = info.value.issues
    assert str(issue.path) == "layout[0].content"
    assert issue.line == 2 and issue.column is not None and issue.column > 10


def test_string_condition_sources_are_linted() -> None:
    """Sources read by string conditions are checked against the allowed list."""
    doc = good()
    doc["slots"]["history"]["when"] = 'len(source("turnz")) > 1'
    with pytest.raises(TemplateValidationError) as info:
        compile_template(doc, allowed_sources=["turns"])
    assert any(
        i.code == "unknown_source" and "turnz" in i.message and str(i.path) == "slots.history.when"
        for i in info.value.issues
    )


def test_source_specs_imply_allowed_and_lint_args() -> None:
    """Specs turn on name lint (their names) and argument-name lint."""
    specs = [SourceSpec(name="turns", returns="list", args={"limit": "int"})]
    with pytest.raises(TemplateValidationError) as info:
        compile_template(good(), source_specs=specs)
    assert [(i.code, str(i.path)) for i in info.value.issues] == [
        ("unknown_arg", "slots.history.plan[0].source.args.tags"),
    ]


def test_check_args_problems_become_issues() -> None:
    """A task kind's argument checker runs on every DataRef; each problem is an issue."""

    def check(source: str, args: Any) -> list[str]:
        return [f"{source}: limit too small"] if args and args.get("limit", 9) < 3 else []

    with pytest.raises(TemplateValidationError) as info:
        compile_template(good(), allowed_sources=["turns"], check_args=check)
    assert [(str(i.path), i.message) for i in info.value.issues] == [
        ("slots.history.plan[0].source.args", "turns: limit too small")
    ]


@pytest.mark.parametrize("value", [None, [], "text", 3])
def test_non_mapping_input_is_a_validation_error(value: Any) -> None:
    """Anything but a mapping raises TemplateValidationError (never another exception)."""
    with pytest.raises(TemplateValidationError):
        compile_template(value)  # type: ignore[arg-type]


def test_validation_error_pickles() -> None:
    """TemplateValidationError survives pickling with its issues."""
    with pytest.raises(TemplateValidationError) as info:
        compile_template({"id": 1})
    again = pickle.loads(pickle.dumps(info.value))
    assert again.issues == info.value.issues


# -- isolation and immutability ----------------------------------------------------------------


def test_compiling_leaves_the_input_unchanged_and_unshared() -> None:
    """Compiling neither changes nor keeps the caller's objects; later edits do not reach it."""
    doc = good()
    before = copy.deepcopy(doc)
    compiled = compile_template(doc)
    assert doc == before
    args = doc["slots"]["history"]["plan"][0]["source"]["args"]
    args["limit"] = 99  # the caller can still edit its own dict
    args["tags"].append("b")
    doc["slots"]["history"]["when"]["value"]["k"].append(2)
    node = compiled.template.slots["history"].plan[0]
    assert node.source.args == {"limit": 2, "tags": ("a",)}
    assert compiled.template.slots["history"].when["value"] == {"k": (1,)}


def test_compiled_template_is_frozen_all_the_way_down() -> None:
    """No attribute, tuple, mapping or data value of a compiled template can be changed."""
    compiled = compile_template(good())
    model = compiled.template
    node = model.slots["history"].plan[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiled.content_hash = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.limit = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        model.slots["new"] = model.slots["history"]  # type: ignore[index]
    with pytest.raises(TypeError):
        node.source.args["limit"] = 5
    with pytest.raises(AttributeError):
        node.source.args["tags"].append("x")
    assert isinstance(model.layout, tuple) and isinstance(node.map, tuple)


def test_meta_and_description_are_dropped_and_empty_content_is_none() -> None:
    """Compilation drops meta/description; empty content means no content."""
    doc = good()
    doc["layout"][0]["content"] = ""
    model = compile_template(doc).template
    assert model.layout[0].content is None
    assert not hasattr(model.slots["history"], "meta")
    assert not hasattr(model, "description")


def test_header_normalised_to_tuple() -> None:
    """A single header block becomes a one-element tuple."""
    model = compile_template(good()).template
    assert [b.content for b in model.layout[1].header] == ["History:"]


# -- hashing and caching -----------------------------------------------------------------------


def test_content_hash_is_sha256_of_canonical_json() -> None:
    """content_hash is sha256 over sorted-key compact JSON; key order does not matter."""
    doc = good()
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert content_hash(doc) == hashlib.sha256(canonical.encode()).hexdigest()
    shuffled = dict(reversed(list(doc.items())))
    assert content_hash(shuffled) == content_hash(doc)
    assert compile_template(doc).content_hash == content_hash(doc)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: dict(reversed(list(d.items()))), id="top-level key order"),
        pytest.param(lambda d: {**d, "slots": dict(reversed(list(d["slots"].items())))}, id="slot order"),
    ],
)
def test_cache_tells_apart_documents_in_another_order(change: Any) -> None:
    """Key order is part of what the cache matches (slot order shapes the render), while the
    content hash, worked out when first asked, ignores it."""
    compiler_module.clear_cache()
    doc = good()
    doc["slots"]["extra"] = {"priority": 1, "plan": [{"kind": "message", "role": "user", "content": "x"}]}
    a = compile_template(doc)
    b = compile_template(change(copy.deepcopy(doc)))
    assert b is not a and compile_template(copy.deepcopy(doc)) is a
    assert a.content_hash == b.content_hash == content_hash(doc)
    assert a == b


def test_equal_by_content() -> None:
    """Compiled templates are equal and hash equal exactly when their content is."""
    a = compile_template(good())
    b = compile_template(copy.deepcopy(good()), task="turn_generation")
    changed = good()
    changed["name"] = "Other"
    c = compile_template(changed)
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2


def test_cache_returns_the_same_object_per_options() -> None:
    """The same content and options give the cached object; other options compile anew."""
    compiler_module.clear_cache()
    a = compile_template(good(), allowed_sources=["turns"])
    assert compile_template(copy.deepcopy(good()), allowed_sources=["turns"]) is a
    assert compile_template(good(), allowed_sources=["turns", "x"]) is not a


def test_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LRU keeps at most CACHE_SIZE entries, dropping the least recently used."""
    compiler_module.clear_cache()
    monkeypatch.setattr(compiler_module, "CACHE_SIZE", 2)
    docs = []
    for i in range(3):
        doc = good()
        doc["id"] = f"t{i}"
        docs.append(doc)
    first = compile_template(docs[0])
    compile_template(docs[1])
    compile_template(docs[2])
    assert len(compiler_module._CACHE) == 2
    assert compile_template(docs[0]) is not first


def test_failed_compiles_are_not_cached() -> None:
    """A template that fails raises every time."""
    for _ in range(2):
        with pytest.raises(TemplateValidationError):
            compile_template({"id": "x"})


# -- inputs ------------------------------------------------------------------------------------


def test_omegaconf_input() -> None:
    """A DictConfig (Hydra's cfg.template) compiles like the dict it holds."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(good())
    assert compile_template(cfg).content_hash == content_hash(good())  # type: ignore[arg-type]


def test_loaded_template_issues_name_file_and_line(tmp_path: Path) -> None:
    """Issues of a template loaded from a file end with file:line of the offending key."""
    path = tmp_path / "writer.yaml"
    path.write_text(
        "id: w\nname: Writer\ntask: demo\nversion: 1\nlayout:\n  - kind: slot\n    name: s\n"
        "slots:\n  s:\n    priority: 0\n    plan:\n      - kind: forEach\n        source: {source: turnz}\n"
        "        map: []\n"
    )
    with pytest.raises(TemplateValidationError) as info:
        compile_template(load_template(path), allowed_sources=["turns"])
    (issue,) = info.value.issues
    assert issue.message.endswith(f"({path}:13)")
    assert f"({path})" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fmt", "line"),
    [
        pytest.param("id: a\nslots:\n  s: {}\n  s: {}\n", "yaml", 4, id="yaml-duplicate-slot"),
        pytest.param(
            '{"id": "a",\n "slots": {"s": {},\n           "s": {}}}', "json", 3, id="json-duplicate-slot"
        ),
    ],
)
def test_loader_rejects_duplicate_slot_keys(text: str, fmt: str, line: int) -> None:
    """Duplicate keys (the reference's unique-slot-name check) fail at load with their line."""
    with pytest.raises(TemplateValidationError) as info:
        load_template_text(text, format=fmt)  # type: ignore[arg-type]
    (issue,) = info.value.issues
    assert issue.code == "duplicate_key" and str(issue.path) == "slots.s" and issue.line == line
    assert "first defined on line" in issue.message


@pytest.mark.parametrize(
    ("text", "fmt"),
    [pytest.param("a: [1\n", "yaml", id="yaml"), pytest.param('{"a": [1,}', "json", id="json")],
)
def test_loader_syntax_errors_have_positions(text: str, fmt: str) -> None:
    """Syntax errors come back as one issue with a line and column."""
    with pytest.raises(TemplateValidationError) as info:
        load_template_text(text, format=fmt)  # type: ignore[arg-type]
    (issue,) = info.value.issues
    assert issue.code == "syntax" and issue.line is not None and issue.column is not None


@pytest.mark.parametrize(
    ("text", "line", "column", "code_point"),
    [
        pytest.param("id: a\nname: b\x1fc\n", 2, 8, "001F", id="unit-separator"),
        pytest.param("\x00", 1, 1, "0000", id="nul"),
        pytest.param("id: a\n\n  x: '\ufffe'\n", 3, 7, "FFFE", id="non-character"),
    ],
)
def test_loader_reports_characters_yaml_forbids(text: str, line: int, column: int, code_point: str) -> None:
    """A control character is one syntax issue at its line and column, not a crash."""
    with pytest.raises(TemplateValidationError) as info:
        load_template_text(text, format="yaml")
    (issue,) = info.value.issues
    assert (issue.code, issue.line, issue.column) == ("syntax", line, column)
    assert issue.message == f"YAML syntax error: the character U+{code_point} is not allowed in YAML"


def test_json_and_yaml_files_load_the_same_data(tmp_path: Path) -> None:
    """A template written as JSON and as YAML loads to the same data and hash."""
    doc = good()
    (tmp_path / "t.json").write_text(json.dumps(doc, indent=2))
    import yaml

    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    a, b = load_template(tmp_path / "t.json"), load_template(tmp_path / "t.yaml")
    assert a.data == b.data == doc
    assert compile_template(a) == compile_template(b)


def test_canonical_conf_template_compiles_for_its_task() -> None:
    """conf/template/tinystories_instruction.yaml compiles against the tinystories task kind."""
    from storyforge.tasks.base import get_task_kind

    kind = get_task_kind("tinystories")
    compiled = compile_template(
        load_template(ROOT / "conf/template/tinystories_instruction.yaml"),
        task=kind.name,
        allowed_sources=kind.allowed_sources,
    )
    assert isinstance(compiled, CompiledTemplate) and compiled.task == "tinystories"


def test_notes_are_attached_not_raised() -> None:
    """Smells become CompiledTemplate.notes; compilation still succeeds."""
    doc = good()
    doc["slots"]["spare"] = {"priority": 3, "plan": []}
    compiled = compile_template(doc)
    assert [(n.code, str(n.path)) for n in compiled.notes] == [("unused_slot", "slots.spare")]


def test_one_compiled_template_renders_from_many_threads() -> None:
    """Concurrent renders of one compiled template all give the same messages."""
    compiled = compile_template(good())
    registry = SourceRegistry({"turns": lambda ctx, args: ctx["turns"][: args["limit"]]})
    ctx = {"name": "Ada", "turns": ["a", "b", "c"]}
    expected = render(compiled, ctx, registry).messages
    results: list[Any] = []

    def worker() -> None:
        for _ in range(200):
            results.append(render(compiled, ctx, registry, budget=50).messages)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 800 and all(r == expected for r in results)
