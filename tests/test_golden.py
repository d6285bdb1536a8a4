"""Golden renders of realistic templates (tests/golden/<template>@v<version>.json).

Run ``pytest tests/test_golden.py --update-golden`` to rewrite the files from the current
output, then review the diff. The canonical TinyStories instruction is also checked against
the hand-written seed-spec renderings, which are never refreshed from engine output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storyforge import compile_template, render
from storyforge.atomic import write_text_atomic
from storyforge.engine.loader import load_template
from storyforge.tasks.base import get_task_kind

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"

# A turn-generation template written for the engine's own golden file: a system prompt, a
# character-card slot with its own budget, a budgeted history read newest first and shown
# oldest first, and an assistant prefill.
TURN_TEMPLATE: dict[str, Any] = {
    "id": "engine_turn_writer",
    "name": "Engine golden: turn writer",
    "task": "turn_generation",
    "version": 1,
    "layout": [
        {
            "kind": "message",
            "role": "system",
            "content": 'You write the next turn of "{{globals.storyTitle}}" as {{actor.name}}. One paragraph.',
        },
        {"kind": "slot", "name": "cards", "header": {"role": "system", "content": "Characters:"}},
        {
            "kind": "slot",
            "name": "history",
            "header": {"role": "user", "content": "Story so far:"},
            "footer": {"role": "user", "content": "Write {{actor.name}}'s next turn."},
        },
        {"kind": "slot", "name": "prefill"},
    ],
    "slots": {
        "cards": {
            "priority": 1,
            "budget": {"maxTokens": 60},
            "plan": [
                {
                    "kind": "forEach",
                    "source": {"source": "characters"},
                    "map": [
                        {
                            "kind": "message",
                            "role": "system",
                            "content": "- {{item.name}}: {{item.description}}",
                        }
                    ],
                }
            ],
        },
        "history": {
            "priority": 2,
            "budget": {"maxTokens": 90},
            "plan": [
                {
                    "kind": "forEach",
                    "source": {"source": "turns", "args": {"order": "desc"}},
                    "fillDir": "prepend",
                    "map": [
                        {
                            "kind": "message",
                            "role": "user",
                            "content": "[{{item.turnNo}}] {{item.authorName}}: {{item.content}}",
                        }
                    ],
                }
            ],
        },
        "prefill": {
            "priority": 0,
            "plan": [{"kind": "message", "role": "assistant", "content": "{{actor.name}}:", "prefix": True}],
        },
    },
}

TURN_CONTEXT: dict[str, Any] = {
    "globals": {"storyTitle": "The Salt Road"},
    "actor": {"id": "ida", "name": "Ida", "description": "A cartographer who trusts maps more than people."},
    "characters": [
        {"id": "ida", "name": "Ida", "description": "A cartographer who trusts maps more than people."},
        {"id": "bram", "name": "Bram", "description": "A mule driver with a song for every mile."},
        {
            "id": "quill",
            "name": "Quill",
            "description": "A crow that repeats the last thing anyone regretted saying.",
        },
    ],
    "turns": [
        {"turnNo": i, "authorName": name, "authorType": "character", "content": text}
        for i, (name, text) in enumerate(
            [
                ("Bram", "We camp here. The mules will not cross the flats in the dark."),
                ("Ida", "The map says there is a well two miles east."),
                ("Quill", "Two miles east! Two miles east!"),
                ("Bram", "Your map said that about the last well too."),
                ("Ida", "The last well was there. It was just full of sand."),
                ("Bram", "Then we sing to the mules and hope the sand is kinder tonight."),
                ("Quill", "Kinder tonight!"),
            ],
            start=1,
        )
    ],
}


def check_golden(name: str, actual: dict[str, Any], update: bool) -> None:
    path = GOLDEN / name
    text = json.dumps(actual, indent=2, ensure_ascii=False) + "\n"
    if update or not path.exists():
        if not update:
            pytest.fail(f"{path} is missing; run pytest --update-golden to create it")
        write_text_atomic(path, text)
        return
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert actual == expected, f"render differs from {path}; run pytest --update-golden and review the diff"


def case(compiled: Any, ctx: dict[str, Any], registry: Any, budget: int | None, name: str) -> dict[str, Any]:
    result = render(compiled, ctx, registry, budget=budget)
    return {
        "name": name,
        "budget": budget,
        "messages": result.messages,
        "warnings": result.warnings,
        "slots": [s.to_dict() for s in result.trace.slots],
    }


SEEDS = [
    {
        "protagonist": "a shy turtle named Tim",
        "theme": "courage",
        "required": ["red ball", "blue kite"],
        "banned": [],
        "min_sentences": 6,
        "max_sentences": 9,
    },
    {
        "protagonist": "Mia",
        "theme": "kindness",
        "required": ["warm soup", "big tree", "yellow boots"],
        "banned": ["scary"],
        "min_sentences": 5,
        "max_sentences": 8,
    },
]


def test_tinystories_instruction_golden(update_golden: bool) -> None:
    """The canonical TinyStories template renders the same messages as its golden file."""
    kind = get_task_kind("tinystories")
    compiled = compile_template(
        load_template(ROOT / "conf/template/tinystories_instruction.yaml"),
        task=kind.name,
        allowed_sources=kind.allowed_sources,
    )
    cases = [case(compiled, seed, kind.registry(seed), None, f"seed{i}") for i, seed in enumerate(SEEDS)]
    check_golden(
        "tinystories_instruction@v1.json",
        {"template": compiled.id, "version": 1, "cases": cases},
        update_golden,
    )


def test_tinystories_instruction_matches_seed_spec_text() -> None:
    """The engine renders exactly the hand-written instructions of the seed spec."""
    spec = json.loads((GOLDEN / "tinystories_spec_instructions.json").read_text(encoding="utf-8"))
    kind = get_task_kind("tinystories")
    compiled = compile_template(
        load_template(ROOT / "conf/template/tinystories_instruction.yaml"),
        task=kind.name,
        allowed_sources=kind.allowed_sources,
    )
    assert spec["cases"]
    for item in spec["cases"]:
        seed = item["seed"]
        messages = render(compiled, seed, kind.registry(seed)).messages
        assert messages == [{"role": "user", "content": item["instruction"]}], item["name"]


def test_engine_turn_writer_golden(update_golden: bool) -> None:
    """A turn-generation template (cards, budgeted history, prefill) under a roomy and a tight budget."""
    kind = get_task_kind("turn_generation")
    compiled = compile_template(
        TURN_TEMPLATE, task=kind.name, allowed_sources=kind.allowed_sources, check_args=kind.check_args
    )
    registry = kind.registry(TURN_CONTEXT)
    cases = [
        case(compiled, TURN_CONTEXT, registry, budget, f"budget-{budget}") for budget in (None, 4096, 120, 40)
    ]
    check_golden(
        "engine_turn_writer@v1.json", {"template": compiled.id, "version": 1, "cases": cases}, update_golden
    )


def test_conf_turn_writer_golden(update_golden: bool) -> None:
    """conf/template/turn_writer.yaml over the task's deterministic 60-turn sample story."""
    from storyforge.tasks.turn_generation import sample_context

    kind = get_task_kind("turn_generation")
    compiled = compile_template(
        load_template(ROOT / "conf/template/turn_writer.yaml"),
        task=kind.name,
        allowed_sources=kind.allowed_sources,
        check_args=kind.check_args,
    )
    ctx = dict(sample_context(turns=60))
    cases = [case(compiled, ctx, kind.registry(ctx), budget, f"budget-{budget}") for budget in (2000, 600)]
    check_golden(
        "turn_writer@v1.json", {"template": compiled.id, "version": 1, "cases": cases}, update_golden
    )
