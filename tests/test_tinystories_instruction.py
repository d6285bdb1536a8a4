"""The canonical TinyStories instruction, rendered by the engine from the packaged template."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from storyforge.errors import DataError, RenderError, TemplateValidationError
from storyforge.tasks.tinystories import render_instruction
from storyforge.tasks.tinystories.instruction import InstructionRenderer, packaged_template_path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests/golden/tinystories_spec_instructions.json").read_text("utf-8"))
TEMPLATE = yaml.safe_load((ROOT / "conf/template/tinystories_instruction.yaml").read_text("utf-8"))


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["name"] for c in GOLDEN["cases"]])
def test_rendering_matches_the_seed_specification(case: dict[str, Any]) -> None:
    """The engine's rendering equals the spec's template filled by hand (NONE, '  - ' lines, no final newline)."""
    assert render_instruction(case["seed"]) == case["instruction"]


def test_packaged_template_is_the_checkout_conf_file() -> None:
    """In a checkout the canonical template is found under <repo>/conf/template/."""
    assert packaged_template_path() == ROOT / "conf/template/tinystories_instruction.yaml"


def test_a_template_dict_renders_like_the_packaged_file() -> None:
    """The composed cfg.template (a plain dict) renders exactly what render_instruction does."""
    renderer = InstructionRenderer(copy.deepcopy(TEMPLATE))
    assert renderer.name == "tinystories_instruction"
    for case in GOLDEN["cases"]:
        assert renderer(case["seed"]) == case["instruction"]


def test_budget_too_small_raises_instead_of_cutting() -> None:
    """With max_tokens below the instruction's cost the seed is refused, never silently shortened."""
    seed = GOLDEN["cases"][0]["seed"]
    assert InstructionRenderer(TEMPLATE, max_tokens=10_000)(seed) == GOLDEN["cases"][0]["instruction"]
    with pytest.raises(
        DataError, match=r"^the instruction does not fit budget\.max_tokens=50: \d+ part\(s\) left out"
    ):
        InstructionRenderer(TEMPLATE, max_tokens=50)(seed)


def test_a_template_with_two_turns_is_refused_at_render() -> None:
    """An instruction template must produce exactly one user message."""
    template = copy.deepcopy(TEMPLATE)
    template["layout"].insert(0, {"kind": "message", "role": "system", "content": "You are kind."})
    with pytest.raises(RenderError, match=r"must render exactly one user message, got system, user"):
        InstructionRenderer(template)(GOLDEN["cases"][0]["seed"])


def test_a_template_reading_an_unknown_source_does_not_compile() -> None:
    """Templates of the tinystories kind may only use the seed's fields as sources."""
    template = copy.deepcopy(TEMPLATE)
    template["slots"]["required"]["plan"][0]["source"] = {"source": "characters"}
    with pytest.raises(TemplateValidationError, match="characters"):
        InstructionRenderer(template)
