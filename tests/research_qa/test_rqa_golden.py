"""Golden user turns: every fixture record in every (model_type, mode) of the selection table.

Refresh with ``python -m pytest tests/research_qa/test_rqa_golden.py --update-golden`` and
review the diff of ``tests/golden/research_qa_prompts.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from storyforge.config.research_qa import packaged_dataset
from storyforge.errors import DataError
from storyforge.tasks.research_qa.format import MODES_BY_MODEL_TYPE, default_prompt_format
from storyforge.tasks.research_qa.prompts import PromptBuilder, PromptRequest

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "research_qa_prompts.json"


def render_all() -> dict[str, object]:
    builder = PromptBuilder(default_prompt_format())
    records = [
        json.loads(line) for line in packaged_dataset().read_text("utf-8").splitlines() if line.strip()
    ]
    out: dict[str, object] = {"system_messages": dict(default_prompt_format().system_messages)}
    for model_type, modes in MODES_BY_MODEL_TYPE.items():
        for mode in modes:
            turns: dict[str, str] = {}
            for record in records:
                rag = record.get("rag") or {}
                try:
                    turns[record["task_id"]] = builder.render_user(
                        PromptRequest(
                            model_type=model_type,
                            mode=mode,
                            instruction=record["instruction"],
                            contexts=rag.get("contexts"),
                            stored_prompt=rag.get("prompt"),
                        )
                    )
                except DataError as exc:
                    turns[record["task_id"]] = f"error: {exc}"
            out[f"{model_type}/{mode}"] = turns
    return out


def test_golden_user_turns(update_golden):
    """Rendered user turns of the fixture match tests/golden/research_qa_prompts.json exactly."""
    rendered = render_all()
    if update_golden:
        GOLDEN.write_text(json.dumps(rendered, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert GOLDEN.is_file(), f"{GOLDEN} is missing; create it with --update-golden and review it"
    assert rendered == json.loads(GOLDEN.read_text("utf-8"))
