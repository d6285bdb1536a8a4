"""The ``storyforge`` command: output and exit codes on good and bad input."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storyforge import cli
from storyforge.cli import main

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "conf" / "template"
CONTEXTS = ROOT / "conf" / "context"

BAD_YAML = textwrap.dedent(
    """\
    id: bad
    name: Bad
    task: turn_generation
    version: 1
    layout:
      - kind: message
        role: system
        content: "Hello {{ actor.name | nofilter }}"
      - kind: message
        role: user
        content: |-
          First line
          Second {{ item.x | shout }} line
      - kind: slot
        name: histroy
    slots:
      history:
        priority: 0
        plan:
          - kind: forEach
            source: {source: turnz}
            map:
              - {kind: message, role: user, content: "{{item.content}}", prefix: true}
          - kind: forEach
            source: {source: turns, args: {limit: 0}}
            map: []
    """
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_YAML, encoding="utf-8")
    return path


# --- lint -------------------------------------------------------------------------------------


def test_lint_good_files(capsys: pytest.CaptureFixture[str]) -> None:
    """Valid templates lint clean, one ok line per file naming its task kind, exit 0."""
    files = [str(TEMPLATES / f"{n}.yaml") for n in ("turn_writer", "chapter_summary", "writing_rewrite")]
    code, out, err = run_cli(capsys, "lint", *files)
    assert code == 0, out + err
    assert out.splitlines() == [
        f"{files[0]}: ok (task turn_generation)",
        f"{files[1]}: ok (task chapter_summarization)",
        f"{files[2]}: ok (task writing_assistant)",
    ]


def test_lint_reports_every_problem_with_its_place(
    capsys: pytest.CaptureFixture[str], bad_file: Path
) -> None:
    """Each problem names file:line:column, the template path and the message; exit 1."""
    code, out, _ = run_cli(capsys, "lint", str(bad_file))
    assert code == 1
    f = str(bad_file)
    lines = out.splitlines()
    assert lines[-1] == f"{f}: 6 problems"
    problems = [ln for ln in lines if ln.startswith(f + ":") and "[" in ln]
    assert len(problems) == 6
    # inside a one-line quoted string: the column is the filter name's column in the file
    assert any(
        ln.startswith(
            f"{f}:8:37: layout[0].content (line 1, column 23 of the string): unknown filter 'nofilter'"
        )
        for ln in problems
    ), problems
    # inside a block literal: the file line of the string's second line
    assert any(
        ln.startswith(
            f"{f}:13:26: layout[1].content (line 2, column 20 of the string): unknown filter 'shout'"
        )
        for ln in problems
    ), problems
    assert f"{f}:21:9: slots.history.plan[0].source: unknown source 'turnz'. Did you mean 'turns'?" in out
    assert "[unknown_source]" in out
    assert any(
        ln.startswith(f"{f}:15:") and "histroy" in ln and ln.endswith("[missing_slot]") for ln in lines
    )
    assert any("prefix" in ln and ln.endswith("[prefix_role]") for ln in lines)
    assert (
        f"{f}:25:33: slots.history.plan[1].source.args: arg 'limit' of source 'turns' must be int >= 1, got 0 "
        "[bad_args]" in lines
    )
    assert "    |" in out  # the engine's caret excerpt is shown


def test_lint_against_a_task_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """--task binds the template and lints its sources against that kind's sources."""
    file = str(TEMPLATES / "writing_rewrite.yaml")
    code, out, _ = run_cli(capsys, "lint", "--task", "turn_generation", file)
    assert code == 1
    task_line = Path(file).read_text(encoding="utf-8").splitlines().index("task: writing_assistant") + 1
    assert (
        f'{file}:{task_line}:1: task: Task kind must be "turn_generation"; this template is for '
        '"writing_assistant" [task_mismatch]'
    ) in out.splitlines()
    assert "unknown source 'styleNotes'" in out


def test_lint_unknown_task_option(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --task is one clear error with a suggestion, exit 1, no traceback."""
    code, out, err = run_cli(capsys, "lint", "--task", "turn_generaton", str(TEMPLATES / "turn_writer.yaml"))
    assert code == 1
    assert out == ""
    assert err.startswith("error: unknown task kind 'turn_generaton'. Did you mean 'turn_generation'?")


def test_lint_template_of_an_unknown_task(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A template for a task kind nobody registered is checked without source lint, with a note."""
    doc = {
        "id": "x",
        "name": "X",
        "task": "poetry",
        "version": 1,
        "layout": [{"kind": "message", "role": "user", "content": "{{anything}}"}],
        "slots": {},
    }
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, out, _ = run_cli(capsys, "lint", str(path))
    assert code == 0
    assert f"{path}: note: task 'poetry' is not a known task kind, so sources were not checked" in out
    assert out.splitlines()[-1] == f"{path}: ok (no task kind)"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        pytest.param(
            "dup.json",
            '{"id": "x",\n  "id": "y"}',
            "dup.json:2:3: id: duplicate key 'id' (first defined on line 1) [duplicate_key]",
            id="duplicate-json-key",
        ),
        pytest.param(
            "broken.yaml", "id: [\n", "broken.yaml:2:1: <template>: YAML syntax error: ", id="yaml-syntax"
        ),
        pytest.param(
            "broken.json", '{"id": }', "broken.json:1:8: <template>: JSON syntax error: ", id="json-syntax"
        ),
    ],
)
def test_lint_file_level_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, expected: str
) -> None:
    """Syntax errors and duplicate keys are reported at their file position."""
    (tmp_path / name).write_text(text, encoding="utf-8")
    code, out, _ = run_cli(capsys, "lint", str(tmp_path / name))
    assert code == 1
    assert out.startswith(f"{tmp_path}/{expected}"), out


def test_lint_keeps_going_after_a_bad_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A missing file is reported and the next file is still linted."""
    good = str(TEMPLATES / "narrator_turn.yaml")
    code, out, _ = run_cli(capsys, "lint", str(tmp_path / "missing.yaml"), good)
    assert code == 1
    assert out.splitlines() == [
        f"{tmp_path / 'missing.yaml'}: error: cannot read the file: No such file or directory",
        f"{good}: ok (task turn_generation)",
    ]


# --- render -----------------------------------------------------------------------------------


def _render_args(
    *extra: str,
    template: str = "turn_writer",
    task: str = "turn_generation",
    context: str = "turn_generation.json",
) -> list[str]:
    return [
        "render",
        str(TEMPLATES / f"{template}.yaml"),
        "--task",
        task,
        "--context",
        str(CONTEXTS / context),
        *extra,
    ]


def test_render_prints_the_messages(capsys: pytest.CaptureFixture[str]) -> None:
    """render prints each message under a role rule, the prefill marked, exit 0."""
    code, out, err = run_cli(capsys, *_render_args())
    assert code == 0, err
    assert err == ""
    assert out.startswith('=== system ===\nYou are co-writing the interactive story "The Heron Crate".\n')
    assert "=== user ===\n## Earlier chapters\nChapter 1: Iris and Bram" in out
    assert out.endswith("=== assistant (prefill) ===\nIris Calloway:\n")


def test_render_json_with_explain(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the messages, warnings, budget lint and (with --explain) the trace as JSON."""
    code, out, err = run_cli(capsys, *_render_args("--json", "--explain", "--budget", "400"))
    assert code == 0
    body = json.loads(out)
    assert set(body) == {"messages", "warnings", "lint", "trace"}
    assert len(body["lint"]) == 1 and "maxTokens add up to 1900" in body["lint"][0]
    assert f"warning: budget: {body['lint'][0]}" in err
    emitted = sum(e["tokens"] for e in body["trace"]["events"] if e["status"] == "rendered")
    assert body["trace"]["budget"]["consumed"] == emitted
    assert body["trace"]["budget"]["max_tokens"] == 400
    assert body["trace"]["budget"]["consumed"] <= 400
    assert {s["name"] for s in body["trace"]["slots"]} == {
        "direction",
        "voice",
        "cast",
        "style",
        "history",
        "summaries",
        "prefill",
    }


def test_render_json_explain_counts_tokens_without_a_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """With no budget, the trace's consumed tokens equal the tokens emitted, and there is no lint."""
    code, out, _ = run_cli(capsys, *_render_args("--json", "--explain"))
    assert code == 0
    body = json.loads(out)
    emitted = sum(e["tokens"] for e in body["trace"]["events"] if e["status"] == "rendered")
    assert body["trace"]["budget"] == {"max_tokens": None, "consumed": emitted}
    assert emitted > 250 and body["lint"] == []


def test_render_explain_shows_kept_and_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    """--explain shows slots in fill order with tokens, and what was skipped and why."""
    code, out, _ = run_cli(capsys, *_render_args("--explain", "--budget", "300"))
    assert code == 0
    assert "template 'turn_writer':" in out
    assert "slots, in fill order:\n  direction (priority 0): rendered, 1 message," in out
    assert "  style (priority 3): skipped: empty" in out
    assert "over_budget" in out


@pytest.mark.parametrize(
    ("extra", "last_role", "has_style_rule"),
    [
        pytest.param([], "assistant", False, id="default-model"),
        pytest.param(["--model", "ollama:llama3.2"], "assistant", True, id="ollama"),
        pytest.param(["--model", "openai:gpt", "--no-prefill"], "user", False, id="no-prefill"),
    ],
)
def test_render_model_branches(
    capsys: pytest.CaptureFixture[str], extra: list[str], last_role: str, has_style_rule: bool
) -> None:
    """--model and --no-prefill set ctx.model, which the template branches on."""
    code, out, _ = run_cli(capsys, *_render_args("--json", *extra))
    assert code == 0
    messages = json.loads(out)["messages"]
    assert messages[-1]["role"] == last_role
    assert ("no markdown" in messages[0]["content"]) is has_style_rule


def test_render_generated_context(capsys: pytest.CaptureFixture[str]) -> None:
    """A $generate context file renders the 200-turn story under the given budget."""
    code, out, _ = run_cli(
        capsys, *_render_args("--json", "--explain", "--budget", "2500", context="turn_generation_long.json")
    )
    assert code == 0
    body = json.loads(out)
    history = next(s for s in body["trace"]["slots"] if s["name"] == "history")
    assert 20 < history["messages"] < 200


def test_render_bad_template_prints_problems(capsys: pytest.CaptureFixture[str], bad_file: Path) -> None:
    """A template with problems prints them all on stderr and exits 1 without rendering."""
    code, out, err = run_cli(
        capsys,
        "render",
        str(bad_file),
        "--task",
        "turn_generation",
        "--context",
        str(CONTEXTS / "turn_generation.json"),
    )
    assert code == 1
    assert out == ""
    assert "Traceback" not in err
    # every problem at the same file:line:column as `storyforge lint` gives it (not the key's line)
    _, lint_out, _ = run_cli(capsys, "lint", "--task", "turn_generation", str(bad_file))
    assert err == lint_out
    assert f"{bad_file}:13:26: layout[1].content (line 2, column 20 of the string)" in err


def test_lint_a_folder_lints_every_template_in_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`storyforge lint conf/template/` lints each template file of the folder; an empty folder fails."""
    code, out, _ = run_cli(capsys, "lint", str(TEMPLATES))
    files = sorted(p for p in TEMPLATES.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
    assert code == 0
    assert [ln.split(": ok")[0] for ln in out.splitlines() if ": ok (" in ln] == [str(p) for p in files]
    code, out, _ = run_cli(capsys, "lint", str(tmp_path))
    assert code == 1
    assert out == f"{tmp_path}: no template files (.json, .yaml, .yml) in this folder\n"


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        pytest.param(_render_args(context="nope.json"), 1, "error: context file not found:", id="no-context"),
        pytest.param(_render_args(task="turn_generaton"), 1, "Did you mean 'turn_generation'", id="bad-task"),
        pytest.param(
            ["render", str(TEMPLATES / "turn_writer.yaml")],
            2,
            "the following arguments are required",
            id="usage",
        ),
        pytest.param(_render_args("--budget", "-5"), 2, "the budget must be >= 0", id="negative-budget"),
        pytest.param(
            _render_args(task="writing_assistant", context="writing_assistant.json"),
            1,
            'Task kind must be "writing_assistant"',
            id="task-mismatch",
        ),
    ],
)
def test_render_expected_failures(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, fragment: str
) -> None:
    """Expected failures exit 1 (usage errors 2) with a message and no traceback."""
    got, _, err = run_cli(capsys, *argv)
    assert got == code
    assert fragment in err
    assert "Traceback" not in err


def test_render_warns_about_bad_context_data(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Bad context data renders what it can and reports each resolver failure on stderr."""
    ctx = json.loads((CONTEXTS / "turn_generation.json").read_text(encoding="utf-8"))
    ctx["turns"] = "not a list"
    path = tmp_path / "ctx.json"
    path.write_text(json.dumps(ctx), encoding="utf-8")
    code, out, err = run_cli(capsys, *_render_args(), "--context", str(path))
    assert code == 0
    assert "## Story so far" not in out
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 1
    assert "context field 'turns' must be a list, got str" in warnings[0]


# --- templates --------------------------------------------------------------------------------


def test_templates_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """add, list, show, update, export and delete against a store named by STORYFORGE_STORE."""
    db = tmp_path / "s.db"
    monkeypatch.setenv("STORYFORGE_STORE", f"sqlite:///{db}")
    writer = str(TEMPLATES / "turn_writer.yaml")
    code, out, _ = run_cli(capsys, "templates", "add", writer)
    assert (code, out) == (0, f"added turn_writer (task turn_generation, revision 1) from {writer}\n")

    code, _, err = run_cli(capsys, "templates", "add", writer)
    assert code == 1
    assert "error: template 'turn_writer' already exists" in err

    code, out, _ = run_cli(
        capsys,
        "templates",
        "import",
        str(TEMPLATES / "narrator_turn.yaml"),
        str(TEMPLATES / "writing_rewrite.yaml"),
    )
    assert code == 0
    assert out.splitlines() == [
        "added narrator_turn (task turn_generation, revision 1)",
        "added writing_rewrite (task writing_assistant, revision 1)",
    ]

    code, out, _ = run_cli(capsys, "templates", "list", "--task", "turn_generation")
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "TASK", "VERSION", "REVISION", "UPDATED", "NAME"]
    assert [ln.split()[0] for ln in lines[1:]] == ["narrator_turn", "turn_writer"]

    code, out, _ = run_cli(capsys, "templates", "show", "turn_writer", "--raw")
    assert code == 0
    assert "status:   valid" in out
    assert '"id": "turn_writer"' in out

    exported = tmp_path / "tw.yaml"
    code, out, _ = run_cli(capsys, "templates", "export", "turn_writer", "-o", str(exported))
    assert (code, out) == (0, f"{exported}\n")
    exported.write_text(
        exported.read_text(encoding="utf-8").replace(
            "name: Turn writer with character cards", "name: Turn writer v2"
        ),
        encoding="utf-8",
    )
    code, out, _ = run_cli(capsys, "templates", "update", str(exported))
    assert out == f"updated turn_writer (task turn_generation, revision 2) from {exported}\n"
    code, out, _ = run_cli(capsys, "templates", "update", str(exported))  # the same file again
    assert out == f"unchanged turn_writer (task turn_generation, revision 2) from {exported}\n"

    code, out, _ = run_cli(capsys, "templates", "export", "--all", str(tmp_path / "all"), "--format", "json")
    assert sorted(Path(p).name for p in out.split()) == [
        "narrator_turn.json",
        "turn_writer.json",
        "writing_rewrite.json",
    ]

    code, out, _ = run_cli(capsys, "templates", "delete", "narrator_turn")
    assert (code, out) == (0, "deleted narrator_turn\n")
    code, _, err = run_cli(capsys, "templates", "show", "narrator_turn")
    assert code == 1
    assert err.startswith("error: no template 'narrator_turn'")


def test_templates_show_flags_an_out_of_band_edit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """show marks a tampered row INVALID, lists its problems and exits 1; --store picks the database."""
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    assert main(["templates", "--store", url, "add", str(TEMPLATES / "narrator_turn.yaml")]) == 0
    con = sqlite3.connect(db)
    con.execute("UPDATE prompt_templates SET raw = replace(raw, '\"turns\"', '\"turnz\"')")
    con.commit()
    con.close()
    capsys.readouterr()
    code, out, err = run_cli(capsys, "templates", "show", "narrator_turn", "--store", url)
    assert code == 1
    assert "status:   INVALID" in out
    assert err.startswith(f"error: 2 problems in template 'narrator_turn' (store:{url}#narrator_turn)")
    assert "edited outside storyforge" in err
    assert "unknown source 'turnz'" in err


def test_templates_add_refuses_invalid_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad_file: Path
) -> None:
    """An invalid file is not stored; the valid ones given with it are."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    code, out, err = run_cli(
        capsys, "templates", "--store", url, "add", str(bad_file), str(TEMPLATES / "chapter_summary.yaml")
    )
    assert code == 1
    assert "error: 6 problems in template 'bad'" in err
    assert (
        out == f"added chapter_summary (task chapter_summarization, revision 1) from "
        f"{TEMPLATES / 'chapter_summary.yaml'}\n"
    )
    _, out, _ = run_cli(capsys, "templates", "--store", url, "list")
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == ["chapter_summary"]


# --- the check subcommand and the process boundary ---------------------------------------------


def test_check_subcommand_is_registered_from_its_module(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the check module imports, `check` gets its arguments and its exit code."""
    package = tmp_path / "fakecheck"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "check.py").write_text(
        textwrap.dedent(
            '''
            """Check fake outputs."""
            def add_arguments(parser):
                parser.add_argument("path")
            def command(args, *, compose):
                print("checked", args.path)
                return 3
            '''
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "_CHECK_MODULE", "fakecheck.check")
    assert run_cli(capsys, "check", "x.jsonl")[:2] == (3, "checked x.jsonl\n")
    monkeypatch.setattr(cli, "_CHECK_MODULE", "nosuchpackage.check")
    code, _, err = run_cli(capsys, "check", "x.jsonl")
    assert code == 2
    assert "invalid choice: 'check'" in err


def _subprocess(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "storyforge.cli", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )


def test_module_entry_point_exit_codes(tmp_path: Path, bad_file: Path) -> None:
    """`python -m storyforge.cli` exits 0 on a good file and 1 on a bad one, never with a traceback."""
    good = _subprocess("lint", str(TEMPLATES / "writing_continue.yaml"), cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert good.stdout.endswith("ok (task writing_assistant)\n")
    bad = _subprocess(
        "render",
        str(bad_file),
        "--task",
        "turn_generation",
        "--context",
        str(CONTEXTS / "turn_generation.json"),
        cwd=tmp_path,
    )
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    assert "bad.yaml: 6 problems" in bad.stderr


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists lint, render and templates and exits 0."""
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("lint", "render", "templates"):
        assert command in out


def test_lint_notes_an_unclosed_placeholder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A `{{` never closed is a note with its file position; the template still lints ok."""
    text = (TEMPLATES / "turn_writer.yaml").read_text("utf-8")
    assert "Setting: {{globals.setting}}" in text
    path = tmp_path / "unclosed.yaml"
    path.write_text(text.replace("Setting: {{globals.setting}}", "Setting: {{globals.setting"), "utf-8")
    code, out, err = run_cli(capsys, "lint", str(path))
    assert code == 0, out + err
    notes = [line for line in out.splitlines() if "unclosed_placeholder" in line]
    assert len(notes) == 1 and "'{{globals.setting' is not closed" in notes[0]
    assert "(line 2, column 10 of the string)" in notes[0]
