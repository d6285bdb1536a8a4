"""Task binding, source lint and structure guards (reference-semantics.md §3)."""

from __future__ import annotations

from typing import Any

import pytest

from storyforge.engine.linter import (
    RefSite,
    check_structure,
    check_task,
    collect,
    lint_sources,
    notes,
)
from storyforge.engine.sources import SourceSpec


def doc_with(layout: list[Any] | None = None, slots: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "t",
        "name": "T",
        "task": "demo",
        "version": 1,
        "layout": layout if layout is not None else [{"kind": "slot", "name": "s"}],
        "slots": slots if slots is not None else {"s": {"priority": 0, "plan": []}},
    }


EVERY_REF = doc_with(
    layout=[
        {"kind": "message", "role": "system", "from": {"source": "layoutFrom"}},
        {
            "kind": "slot",
            "name": "s",
            "header": {"role": "user", "from": {"source": "headerFrom"}},
            "footer": [{"role": "user", "from": {"source": "footerFrom", "args": {"n": 1}}}],
        },
    ],
    slots={
        "s": {
            "priority": 0,
            "when": {"type": "exists", "ref": {"source": "slotWhen"}},
            "plan": [
                {"kind": "message", "role": "user", "from": {"source": "planFrom"}},
                {
                    "kind": "forEach",
                    "source": {"source": "loopSource"},
                    "map": [
                        {
                            "kind": "if",
                            "when": {"type": "nonEmpty", "ref": {"source": "ifWhen"}},
                            "then": [{"kind": "message", "role": "user", "from": {"source": "$item"}}],
                            "else": [{"kind": "message", "role": "user", "from": {"source": "elseFrom"}}],
                        }
                    ],
                },
            ],
        }
    },
)


def test_collect_finds_every_dataref_with_its_path() -> None:
    """Layout, header/footer, slot when, plan from, forEach source, if when: all collected, nested."""
    found = {(str(site.path), site.source) for site in collect(EVERY_REF).refs}
    assert found == {
        ("layout[0].from", "layoutFrom"),
        ("layout[1].header.from", "headerFrom"),
        ("layout[1].footer[0].from", "footerFrom"),
        ("slots.s.when.ref", "slotWhen"),
        ("slots.s.plan[0].from", "planFrom"),
        ("slots.s.plan[1].source", "loopSource"),
        ("slots.s.plan[1].map[0].when.ref", "ifWhen"),
        ("slots.s.plan[1].map[0].then[0].from", "$item"),
        ("slots.s.plan[1].map[0].else[0].from", "elseFrom"),
    }


def test_collect_finds_leaves_and_skips_empty_content() -> None:
    """Every non-empty content and interleave text is a leaf; empty content is no content."""
    doc = doc_with(
        layout=[{"kind": "message", "role": "user", "content": ""}, {"kind": "slot", "name": "s"}],
        slots={
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "x"},
                        "interleave": {"kind": "separator", "text": "--"},
                        "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                    }
                ],
            }
        },
    )
    assert [(str(p), t) for p, t in collect(doc).leaves] == [
        ("slots.s.plan[0].interleave.text", "--"),
        ("slots.s.plan[0].map[0].content", "{{item}}"),
    ]


def test_collect_tolerates_malformed_documents() -> None:
    """The walk skips parts of the wrong shape instead of failing."""
    for doc in (
        None,
        [],
        {"layout": "x", "slots": [1]},
        {"slots": {"s": {"plan": [5, {"kind": "forEach"}]}}},
    ):
        collect(doc)


@pytest.mark.parametrize(
    ("task", "template_task", "problem"),
    [
        pytest.param(None, "anything", None, id="no-task-no-check"),
        pytest.param("demo", "demo", None, id="match"),
        pytest.param("demo", "Demo", 'Task kind must be "demo"', id="case-matters"),
        pytest.param("turn_generation", "demo", 'Task kind must be "turn_generation"', id="mismatch"),
    ],
)
def test_task_binding(task: str | None, template_task: str, problem: str | None) -> None:
    """The template's task must equal the expected task exactly, reported at path `task`."""
    doc = doc_with()
    doc["task"] = template_task
    issues = check_task(doc, task)
    if problem is None:
        assert issues == []
    else:
        assert [str(i.path) for i in issues] == ["task"]
        assert problem in issues[0].message and template_task in issues[0].message


def sites(*names: str) -> list[RefSite]:
    from storyforge.errors import TemplatePath

    return [RefSite(path=TemplatePath(("layout", i, "from")), source=n) for i, n in enumerate(names)]


def test_lint_off_without_allowed_list() -> None:
    """allowed_sources=None turns name linting off."""
    assert lint_sources(sites("anything", "goes"), None) == []


def test_empty_allowed_list_still_lints() -> None:
    """An empty list turns linting on: only the reserved sources are allowed."""
    issues = lint_sources(sites("turns", "$item", "$ctx"), [])
    assert [i.message.split(".")[0] for i in issues] == ["unknown source 'turns'"]
    assert "Allowed: none" in issues[0].message


def test_unknown_source_suggests_and_lists_allowed() -> None:
    """A misspelt source gets a suggestion and the allowed list, at the DataRef's path."""
    (issue,) = lint_sources(sites("charcters"), ["turns", "characters"])
    assert str(issue.path) == "layout[0].from"
    assert issue.code == "unknown_source"
    assert issue.message.startswith(
        "unknown source 'charcters'. Did you mean 'characters'? Allowed: turns, characters"
    )


def test_every_unknown_use_is_reported() -> None:
    """Each use of an unknown source is its own issue (one per path)."""
    issues = lint_sources(sites("a", "b", "a", "ok"), ["ok"])
    assert [str(i.path) for i in issues] == ["layout[0].from", "layout[1].from", "layout[2].from"]


@pytest.mark.parametrize("name", ["$item", "$index", "$parent", "$globals", "$ctx"])
def test_reserved_sources_always_allowed(name: str) -> None:
    """Reserved sources pass lint whatever the allowed list says."""
    assert lint_sources(sites(name), []) == []


def test_dollar_typo_suggests_reserved_source() -> None:
    """A misspelt reserved source suggests the reserved name."""
    (issue,) = lint_sources(sites("$itme"), ["turns"])
    assert "Did you mean '$item'?" in issue.message


SPECS = [
    SourceSpec(name="turns", returns="list[Turn]", args={"limit": "int >= 1", "order": "'asc' | 'desc'"}),
    SourceSpec(name="intent", returns="Intent"),
]


@pytest.mark.parametrize(
    ("source", "args", "has_args", "expected"),
    [
        pytest.param("turns", {"limit": 3}, True, [], id="known-arg"),
        pytest.param("turns", None, False, [], id="no-args"),
        pytest.param(
            "turns", {"limt": 3}, True, ["has no argument 'limt'. Did you mean 'limit'?"], id="typo"
        ),
        pytest.param("turns", [1], True, ["must be a mapping of limit, order"], id="args-not-mapping"),
        pytest.param("intent", {"x": 1}, True, ["takes no arguments"], id="no-args-accepted"),
        pytest.param("$item", {"path": "a"}, True, [], id="reserved-path"),
        pytest.param("$parent", {"level": 2, "path": "a"}, True, [], id="parent-level"),
        pytest.param("$index", {"path": "a"}, True, ["takes no arguments"], id="index-takes-none"),
        pytest.param("$ctx", {"pth": "a"}, True, ["Did you mean 'path'?"], id="reserved-typo"),
    ],
)
def test_arg_lint_with_specs(source: str, args: Any, has_args: bool, expected: list[str]) -> None:
    """With specs, argument names are checked against SourceSpec.args (and the reserved ones)."""
    from storyforge.errors import TemplatePath

    site = RefSite(
        path=TemplatePath(("slots", "s", "plan", 0, "source")), source=source, args=args, has_args=has_args
    )
    issues = lint_sources([site], ["turns", "intent"], SPECS)
    assert len(issues) == len(expected)
    for issue, fragment in zip(issues, expected, strict=True):
        assert fragment in issue.message
        assert str(issue.path).startswith("slots.s.plan[0].source.args")


def test_layout_must_reference_existing_slots() -> None:
    """A layout slot node naming a missing slot is an issue at its name, with a suggestion."""
    doc = doc_with(
        layout=[{"kind": "slot", "name": "histroy"}, {"kind": "slot", "name": "history"}],
        slots={"history": {"priority": 0, "plan": []}},
    )
    (issue,) = check_structure(doc, collect(doc))
    assert str(issue.path) == "layout[0].name"
    assert issue.message.startswith('Layout references non-existent slot: "histroy". Did you mean "history"?')


def test_same_slot_twice_and_unused_slots_are_allowed() -> None:
    """Referring to a slot twice is fine; so is a slot the layout never shows."""
    doc = doc_with(
        layout=[{"kind": "slot", "name": "a"}, {"kind": "slot", "name": "a"}],
        slots={"a": {"priority": 0, "plan": []}, "b": {"priority": 1, "plan": []}},
    )
    assert check_structure(doc, collect(doc)) == []


PREFIX_SITES = [
    pytest.param(
        [{"kind": "message", "role": "user", "prefix": True}, {"kind": "slot", "name": "s"}],
        {},
        "layout[0].prefix",
        id="layout-message",
    ),
    pytest.param(
        [{"kind": "slot", "name": "s", "header": {"role": "system", "prefix": True}}],
        {},
        "layout[0].header.prefix",
        id="header",
    ),
    pytest.param(
        [{"kind": "slot", "name": "s", "footer": [{"role": "user"}, {"role": "user", "prefix": True}]}],
        {},
        "layout[0].footer[1].prefix",
        id="footer",
    ),
    pytest.param(
        None,
        {"s": {"priority": 0, "plan": [{"kind": "message", "role": "system", "prefix": True}]}},
        "slots.s.plan[0].prefix",
        id="plan",
    ),
    pytest.param(
        None,
        {
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "x"},
                        "map": [{"kind": "message", "role": "user", "prefix": True}],
                    }
                ],
            }
        },
        "slots.s.plan[0].map[0].prefix",
        id="forEach",
    ),
    pytest.param(
        None,
        {
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "if",
                        "when": "x",
                        "then": [],
                        "else": [
                            {
                                "kind": "forEach",
                                "source": {"source": "x"},
                                "map": [
                                    {
                                        "kind": "if",
                                        "when": "y",
                                        "then": [{"kind": "message", "role": "user", "prefix": True}],
                                    }
                                ],
                            }
                        ],
                    }
                ],
            }
        },
        "slots.s.plan[0].else[0].map[0].then[0].prefix",
        id="deep-if-forEach-if",
    ),
]


@pytest.mark.parametrize(("layout", "slots", "path"), PREFIX_SITES)
def test_prefix_only_on_assistant_messages(layout: Any, slots: dict[str, Any], path: str) -> None:
    """prefix: true on a non-assistant message is an issue wherever the block sits."""
    doc = doc_with(layout=layout, slots=slots or None)
    issues = check_structure(doc, collect(doc))
    assert [str(i.path) for i in issues] == [path]
    assert issues[0].code == "prefix_role"
    assert "only allowed on assistant messages" in issues[0].message


def test_prefix_false_and_assistant_prefix_are_fine() -> None:
    """prefix: false is fine on any role; prefix: true is fine on assistant."""
    doc = doc_with(
        layout=[
            {"kind": "message", "role": "user", "prefix": False},
            {"kind": "message", "role": "assistant", "prefix": True},
            {"kind": "slot", "name": "s"},
        ]
    )
    assert check_structure(doc, collect(doc)) == []


def test_notes_flag_smells_without_failing() -> None:
    """Notes point at a child budget above its parent's, unused slots and misspelt keys."""
    doc = doc_with(
        slots={
            "s": {
                "priority": 0,
                "budget": {"maxTokens": 100},
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "x"},
                        "budget": {"maxTokens": 500},
                        "map": [
                            {
                                "kind": "message",
                                "role": "user",
                                "content": "x",
                                "skipIfEmptyInterpolaton": True,
                            }
                        ],
                    }
                ],
            },
            "unused": {"priority": 1, "plan": []},
        }
    )
    found = {(i.code, str(i.path)) for i in notes(doc, collect(doc))}
    assert found == {
        ("budget_above_parent", "slots.s.plan[0].budget.maxTokens"),
        ("unused_slot", "slots.unused"),
        ("unknown_key", "slots.s.plan[0].map[0].skipIfEmptyInterpolaton"),
    }


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("Setting: {{globals.setting", (1, 10), id="at-the-end"),
        pytest.param("one\ntwo {{ a }} and {{b", (2, 17), id="after-a-closed-one"),
        pytest.param("{{#if a}}x{{/if}} {{", (1, 19), id="bare-braces"),
        pytest.param("Setting: {{globals.setting\nWrite as {{actor.name}}.", (1, 10), id="before-another"),
    ],
)
def test_an_unclosed_placeholder_is_a_note_at_its_place(text: str, where: tuple[int, int]) -> None:
    """A ``{{`` never closed renders as text (reference behaviour): a note names it."""
    doc = doc_with(
        slots={"s": {"priority": 0, "plan": [{"kind": "message", "role": "user", "content": text}]}}
    )
    found = [
        (i.code, str(i.path), (i.line, i.column)) for i in notes(doc, collect(doc)) if i.code != "unused_slot"
    ]
    assert found == [("unclosed_placeholder", "slots.s.plan[0].content", where)]


@pytest.mark.parametrize("text", ["{{a}}", "no braces", "{{#if a}}x{{/if}}", "a }} b"])
def test_closed_placeholders_give_no_note(text: str) -> None:
    doc = doc_with(
        slots={"s": {"priority": 0, "plan": [{"kind": "message", "role": "user", "content": text}]}}
    )
    assert [i for i in notes(doc, collect(doc)) if i.code == "unclosed_placeholder"] == []
