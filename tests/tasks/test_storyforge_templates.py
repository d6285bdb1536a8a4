"""Golden renderings of the StoryForge task templates in conf/template over conf/context samples.

Each template's cases live in ``tests/golden/<template>@v1.json`` (``turn_writer``'s budget
cases are the engine's golden file, so its model-branch cases are kept beside it in
``turn_writer@v1.branches.json``). Refresh with ``pytest tests/tasks --update-golden`` and
review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storyforge import compile_template, render
from storyforge.atomic import write_text_atomic
from storyforge.engine.loader import load_template
from storyforge.jobs.render_task import load_context, with_model
from storyforge.tasks.base import get_task_kind

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"

NONE = {"provider": "none", "name": None, "prefill": True}
OLLAMA = {"provider": "ollama", "name": "llama3.2", "prefill": True}
OPENAI_NO_PREFILL = {"provider": "openai", "name": "gpt-test", "prefill": False}

# (template, golden file, [(case name, context, model, budget)])
CASES: list[tuple[str, str, list[tuple[str, str, dict[str, Any], int | None]]]] = [
    (
        "turn_writer",
        "turn_writer@v1.branches.json",
        [
            ("sample/none", "turn_generation", NONE, None),
            ("sample/ollama", "turn_generation", OLLAMA, None),
            ("long-200/openai-no-prefill/budget-2500", "turn_generation_long", OPENAI_NO_PREFILL, 2500),
        ],
    ),
    (
        "narrator_turn",
        "narrator_turn@v1.json",
        [
            ("sample/none", "turn_generation", NONE, None),
            ("long-200/none/budget-1500", "turn_generation_long", NONE, 1500),
        ],
    ),
    (
        "chapter_summary",
        "chapter_summary@v1.json",
        [
            ("sample/none", "chapter_summarization", NONE, None),
            ("sample/none/budget-300", "chapter_summarization", NONE, 300),
        ],
    ),
    (
        "chapter_summary_json",
        "chapter_summary_json@v1.json",
        [
            ("sample/none", "chapter_summarization", NONE, None),
            ("sample/openai-no-prefill", "chapter_summarization", OPENAI_NO_PREFILL, None),
        ],
    ),
    (
        "writing_rewrite",
        "writing_rewrite@v1.json",
        [
            ("sample/none", "writing_assistant", NONE, None),
            ("sample/none/budget-120", "writing_assistant", NONE, 120),
        ],
    ),
    (
        "writing_continue",
        "writing_continue@v1.json",
        [
            ("sample/ollama", "writing_assistant", OLLAMA, None),
            ("sample/openai-no-prefill", "writing_assistant", OPENAI_NO_PREFILL, None),
            ("sample/none/budget-200", "writing_assistant", NONE, 200),
        ],
    ),
]


def _compile(template: str) -> tuple[Any, Any]:
    loaded = load_template(ROOT / "conf" / "template" / f"{template}.yaml")
    kind = get_task_kind(loaded.data["task"])
    compiled = compile_template(loaded, task=kind.name, source_specs=kind.sources, check_args=kind.check_args)
    return kind, compiled


def _render_case(kind: Any, compiled: Any, context: str, model: dict[str, Any], budget: int | None) -> Any:
    ctx = with_model(load_context(context), model)
    return render(compiled, ctx, kind.registry(ctx), budget=budget)


@pytest.mark.parametrize(("template", "golden", "cases"), CASES, ids=[c[0] for c in CASES])
def test_golden_rendering(template: str, golden: str, cases: Any, update_golden: bool) -> None:
    """The template renders exactly the reviewed messages, warnings and slot outcomes."""
    kind, compiled = _compile(template)
    actual_cases = []
    for name, context, model, budget in cases:
        result = _render_case(kind, compiled, context, model, budget)
        actual_cases.append(
            {
                "name": name,
                "context": context,
                "model": model,
                "budget": budget,
                "messages": result.messages,
                "warnings": result.warnings,
                "slots": [s.to_dict() for s in result.trace.slots],
            }
        )
    actual = {"template": template, "version": 1, "cases": actual_cases}
    path = GOLDEN / golden
    text = json.dumps(actual, indent=2, ensure_ascii=False) + "\n"
    if update_golden:
        write_text_atomic(path, text)
        return
    if not path.exists():
        pytest.fail(f"{path} is missing; run pytest tests/tasks --update-golden to create it")
    expected = json.loads(path.read_text(encoding="utf-8"))
    for want, got in zip(expected["cases"], actual_cases, strict=True):
        assert got == want, (
            f"case {want['name']!r} differs from {path}; run --update-golden and review the diff"
        )
    assert actual == expected


@pytest.mark.parametrize(
    ("template", "context", "model", "budget"),
    [(t, ctx, model, budget) for t, _, cases in CASES for _, ctx, model, budget in cases],
)
def test_renders_cleanly_and_within_budget(
    template: str, context: str, model: dict[str, Any], budget: int | None
) -> None:
    """Sample contexts render with no warnings but dropped layout blocks (pinned by the golden files at
    tight budgets), and never past the budget."""
    kind, compiled = _compile(template)
    result = _render_case(kind, compiled, context, model, budget)
    assert [w for w in result.warnings if "dropped: " not in w] == []
    if budget is None:
        assert result.warnings == []
    assert result.messages
    if budget is not None:
        assert result.trace.consumed <= budget


def test_model_branches_change_the_prompt() -> None:
    """ctx.model decides the prefill and the provider-specific instructions."""
    kind, compiled = _compile("turn_writer")
    plain = _render_case(kind, compiled, "turn_generation", NONE, None).messages
    local = _render_case(kind, compiled, "turn_generation", OLLAMA, None).messages
    no_prefill = _render_case(kind, compiled, "turn_generation", OPENAI_NO_PREFILL, None).messages
    assert plain[-1] == {"role": "assistant", "content": "Iris Calloway:", "prefix": True}
    assert no_prefill[-1]["role"] == "user"
    assert "no markdown" in local[0]["content"]
    assert "no markdown" not in plain[0]["content"]


def test_long_history_keeps_the_newest_turns_in_reading_order() -> None:
    """Under budget, the 200-turn history keeps a contiguous run of the newest turns, oldest first."""
    kind, compiled = _compile("turn_writer")
    result = _render_case(kind, compiled, "turn_generation_long", OPENAI_NO_PREFILL, 2500)
    ctx = load_context("turn_generation_long")
    lines = [f"{t['authorName']}: {t['content']}" for t in ctx["turns"]]
    user = result.messages[1]["content"]
    story = user.split("## Story so far\n", 1)[1].split("\n## Direction", 1)[0].split("\n")
    assert 20 < len(story) < 200  # the budget cut the history
    assert story == lines[-len(story) :]
    history = next(s for s in result.trace.slots if s.name == "history")
    assert history.tokens <= 1500


def test_bad_source_args_in_a_template_become_warnings_not_failures() -> None:
    """A DataRef whose args a handler rejects renders without that data and says why."""
    kind = get_task_kind("turn_generation")
    template = {
        "id": "args_at_render",
        "name": "Args at render",
        "task": "turn_generation",
        "version": 1,
        "layout": [{"kind": "slot", "name": "s"}],
        "slots": {
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "$ctx", "args": {"path": "refs"}},
                        "map": [
                            {
                                "kind": "forEach",
                                "source": {"source": "turns", "args": {"$item": 1}},
                                "map": [{"kind": "message", "role": "user", "content": "never"}],
                            },
                        ],
                    },
                    {"kind": "message", "role": "user", "content": "still here"},
                ],
            }
        },
    }
    # Compiled without lint (as a caller without the task's specs would), so the bad arg reaches render.
    compiled = compile_template(template)
    ctx = dict(load_context("turn_generation"), refs=[1])
    result = render(compiled, ctx, kind.registry(ctx))
    assert result.messages == [{"role": "user", "content": "still here"}]
    assert len(result.warnings) == 1
    assert "source 'turns' has no arg '$item'" in result.warnings[0]


@pytest.mark.parametrize("task", ["turn_generation", "chapter_summarization", "writing_assistant"])
def test_authoring_guide_lists_every_source_and_arg(task: str) -> None:
    """docs/authoring.md documents every source and argument the task kind publishes."""
    guide = (ROOT / "docs" / "authoring.md").read_text(encoding="utf-8")
    section = guide.split(f"### `{task}`", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    for spec in get_task_kind(task).sources:
        row = next((ln for ln in section.splitlines() if ln.startswith(f"| `{spec.name}` |")), None)
        assert row is not None, f"{spec.name} is not documented for {task}"
        for arg in spec.args:
            assert f"`{arg}`" in row or ("as in `turn_generation`" in row and spec.name == "turns"), (
                spec.name,
                arg,
            )
