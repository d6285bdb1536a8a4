"""Hostile and careless input to the engine: each ends in one clear problem, never a traceback
or a hang, and the fidelity leftovers of the differential run render as the reference does."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from pytest import param

import storyforge
from storyforge import SourceRegistry, TemplateValidationError, compile_template, render
from storyforge.cli import main
from storyforge.engine.loader import MAX_ALIAS_NODES, load_template, load_template_text
from storyforge.engine.runtime import note
from storyforge.engine.sources import MISSING

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = ROOT / "conf" / "context" / "turn_generation.json"


def _doc(content: str) -> dict[str, Any]:
    layout = [{"kind": "message", "role": "user", "content": content}]
    return {"id": "h", "name": "H", "task": "turn_generation", "version": 1, "layout": layout, "slots": {}}


def _text(content: str, ctx: dict[str, Any]) -> tuple[str, list[str]]:
    result = render(compile_template(_doc(content)), ctx)
    return "".join(m["content"] for m in result.messages), result.warnings


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- lone surrogates -----------------------------------------------------------------------------


def test_lone_surrogate_literal_is_a_lint_problem() -> None:
    """{{ "\\ud800" }} is refused when compiled, at its column, saying what to write instead."""
    with pytest.raises(TemplateValidationError) as caught:
        compile_template(_doc('Hi {{ "\\ud800" }}'))
    (issue,) = caught.value.issues
    assert (str(issue.path), issue.line, issue.column) == ("layout[0].content", 1, 7)
    assert issue.message.startswith("the string holds a lone surrogate (\\ud800), which is not text")


def test_surrogate_pair_literal_is_one_character() -> None:
    """Two escapes that make a pair are the character they encode."""
    assert _text('{{ "\\ud83d\\ude00" }}', {})[0] == "\U0001f600"


def test_lone_surrogate_template_fails_lint_and_render_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """lint reports the problem (exit 1); render stops with one clear line, no traceback."""
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(_doc('{{ "\\ud800" }}')), encoding="utf-8")
    code, out, _ = _run(capsys, "lint", str(path))
    assert code == 1 and "lone surrogate" in out
    code, _, err = _run(capsys, "render", str(path), "--task", "turn_generation", "--context", str(CONTEXT))
    assert code == 1
    assert "lone surrogate" in err and "Traceback" not in err


def test_lone_surrogate_in_a_context_file_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A context whose JSON holds \\ud800 is refused by name, not a crash while printing."""
    ctx = json.loads(CONTEXT.read_text(encoding="utf-8"))
    ctx["title"] = "\ud800"
    bad = tmp_path / "ctx.json"
    bad.write_text(json.dumps(ctx), encoding="utf-8")
    template = tmp_path / "t.yaml"
    template.write_text(json.dumps(_doc("{{title}}")), encoding="utf-8")
    code, _, err = _run(capsys, "render", str(template), "--task", "turn_generation", "--context", str(bad))
    assert code == 1
    assert "unpaired surrogate \\ud800" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        param(["\ud800"], '["\\ud800"]', id="lone-high"),
        param({"k": "a\udc00b"}, '{"k":"a\\udc00b"}', id="lone-low"),
        param({"\udfff": 1}, '{"\\udfff":1}', id="lone-in-key"),
        param(["\ud83d\ude00"], '["\ud83d\ude00"]', id="a-pair-stays-raw"),
        param(["é\u2028"], '["é\u2028"]', id="other-non-ascii-raw"),
    ],
)
def test_json_escapes_lone_surrogates_like_the_reference(value: Any, expected: str) -> None:
    """A value rendered as JSON escapes a lone surrogate as \\udXXX (JSON.stringify), nothing else."""
    assert _text("{{v}}", {"v": value})[0] == expected
    assert _text("{{ v | json }}", {"v": value})[0] == expected


# -- placeholder trimming --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        param("{{\ufeffname}}", "N", id="bom-trimmed"),
        param("{{ name\ufeff }}", "N", id="bom-trailing-trimmed"),
        param("{{\u3000name\u00a0}}", "N", id="js-spaces-trimmed"),
        param("{{\x1cname}}", "FS", id="x1c-kept"),
        param("{{name\x1f}}", "US", id="x1f-kept"),
        param("{{\x85name}}", "NEL", id="x85-kept"),
    ],
)
def test_placeholder_trimmed_with_javascript_whitespace(content: str, expected: str) -> None:
    """Placeholder text is trimmed as the reference trims it (String.prototype.trim)."""
    ctx = {"name": "N", "\x1cname": "FS", "name\x1f": "US", "\x85name": "NEL"}
    assert _text(content, ctx)[0] == expected


# -- deep data -----------------------------------------------------------------------------------


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_data_nested_within_the_json_depth_renders() -> None:
    """Data nested 500 deep renders as JSON, like the reference."""
    text, warnings = _text("{{v}}", {"v": _deep(500)})
    assert text == "[" * 500 + "1" + "]" * 500
    assert warnings == []


def test_data_nested_1000_deep_renders_empty_with_a_warning() -> None:
    """Past MAX_JSON_DEPTH the value renders empty and one warning says why (a documented limit)."""
    text, warnings = _text("[{{v}}]", {"v": _deep(1000)})
    assert text == "[]"
    assert warnings == ["a value nested more than MAX_JSON_DEPTH=500 lists or mappings deep rendered empty"]


def test_warnings_noted_in_a_hot_render_belong_to_that_render_only() -> None:
    """A template rendered the common way (plain context, task registry, no budget) gets
    the warnings its value rules note, once per render; a note made outside any render, or by
    an earlier render, never reaches a later one."""
    compiled = compile_template(_doc("[{{v}}]"))
    registry = SourceRegistry()
    deep = "a value nested more than MAX_JSON_DEPTH=500 lists or mappings deep rendered empty"
    note("noted outside any render")
    assert render(compiled, {"v": 1}, registry).warnings == []
    for _ in range(2):
        assert render(compiled, {"v": _deep(1000)}, registry).warnings == [deep]
    assert render(compiled, {"v": 1}, registry).warnings == []
    note("noted outside any render")
    assert render(compiled, {"v": _deep(1000)}, registry).warnings == [deep]


# -- template files --------------------------------------------------------------------------------

_BOMB = "\n".join(
    [f"a0: &a0 [{', '.join(['x'] * 9)}]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    + ["id: b", "name: b", "task: x", "version: 1", "layout: []", "slots: {}"]
)


def test_yaml_alias_bomb_is_refused_before_expanding() -> None:
    """Aliases that would add past MAX_ALIAS_NODES nodes are one problem, found without expanding."""
    with pytest.raises(TemplateValidationError) as caught:
        load_template_text(_BOMB, format="yaml")
    (issue,) = caught.value.issues
    assert issue.code == "too_large"
    assert f"MAX_ALIAS_NODES={MAX_ALIAS_NODES:,}" in issue.message


def test_a_few_reused_blocks_are_fine() -> None:
    """Ordinary anchors and aliases (a shared block used a few times) still load."""
    text = "shared: &s {kind: message, role: user, content: hi}\nlayout: [*s, *s, *s]\n"
    assert (
        load_template_text(text, format="yaml").data["layout"]
        == [{"kind": "message", "role": "user", "content": "hi"}] * 3
    )


@pytest.fixture
def not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("id: t\nname: Caf\u00e9\n".encode("latin-1"))
    return path


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def test_non_utf8_file_names_line_and_column(not_utf8: Path) -> None:
    """A file that is not UTF-8 is one problem naming the line and column of the first bad byte."""
    with pytest.raises(TemplateValidationError) as caught:
        load_template(not_utf8)
    (issue,) = caught.value.issues
    assert (issue.code, issue.line, issue.column) == ("file", 2, 10)
    assert issue.message.startswith("the file is not UTF-8 text: byte 0xe9")


def test_fifo_is_refused_without_opening_it(fifo: Path) -> None:
    """A FIFO as the template path is refused at once (nothing waits for a writer)."""
    with pytest.raises(TemplateValidationError, match="the template path is a FIFO"):
        load_template(fifo)


def _in_thread(fn: Any) -> Any:
    """Run ``fn`` in a thread, failing (instead of hanging the run) if it does not end."""
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the command hung"
    return box[0]


@pytest.mark.parametrize("which", ["not_utf8", "fifo"])
@pytest.mark.parametrize(
    "command",
    [
        param(["lint"], id="lint"),
        param(["render", "--task", "turn_generation", "--context", str(CONTEXT)], id="render"),
        param(["templates", "add"], id="templates-add"),
    ],
)
def test_bad_template_files_give_one_clear_line(
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    which: str,
    command: list[str],
) -> None:
    """lint, render and templates add each exit 1 with a message naming the problem, no traceback."""
    monkeypatch.setenv("STORYFORGE_STORE", f"sqlite:///{tmp_path / 'store.db'}")
    path = str(request.getfixturevalue(which))
    argv = [*command[:1], path, *command[1:]] if command[0] != "templates" else [*command, path]
    code = _in_thread(lambda: main(argv))
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert code == 1
    assert ("not UTF-8 text" if which == "not_utf8" else "is a FIFO") in shown
    assert "Traceback" not in shown


# -- the public "nothing" ------------------------------------------------------------------------


def test_missing_is_exported() -> None:
    """storyforge.MISSING is the engine's one sentinel for "nothing" (JavaScript's undefined)."""
    assert storyforge.MISSING is MISSING
    assert "MISSING" in storyforge.__all__
    assert not MISSING and repr(MISSING) == "MISSING"


def _slot_doc(plan: list[Any]) -> dict[str, Any]:
    doc = _doc("x")
    doc["layout"] = [{"kind": "slot", "name": "s"}]
    doc["slots"] = {"s": {"priority": 0, "plan": plan}}
    return doc


def test_a_handler_returning_missing_is_nothing() -> None:
    """A handler that returns MISSING is a source with no value: not null in conditions, an
    empty forEach and an empty ``from`` message, as a source without a handler."""

    def said(text: str, kind: str) -> dict[str, Any]:
        when = {"type": kind, "ref": {"source": "v"}, "value": None}
        return {"kind": "if", "when": when, "then": [{"kind": "message", "role": "user", "content": text}]}

    plan = [
        said("eq-null", "eq"),
        said("neq-null", "neq"),
        {"kind": "message", "role": "user", "from": {"source": "v"}},
        {
            "kind": "forEach",
            "source": {"source": "v"},
            "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
        },
    ]
    compiled = compile_template(_slot_doc(plan))
    nothing = render(compiled, {}, SourceRegistry({"v": lambda ctx, args: MISSING}))
    absent = render(compiled, {}, SourceRegistry({}))
    null = render(compiled, {}, SourceRegistry({"v": lambda ctx, args: None}))
    assert nothing.messages == absent.messages == [{"role": "user", "content": "neq-null"}]
    assert null.messages == [{"role": "user", "content": "eq-null"}]
    assert nothing.trace.to_dict() == absent.trace.to_dict()
