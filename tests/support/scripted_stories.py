"""Scripted TinyStories answers for :class:`~tests.support.fake_server.FakeServer`.

Takes: an OpenAI request body. Gives: :func:`passing_story` (a story meeting a canonical
instruction's constraints), :func:`script` (the first attempt of sample 0 fails in a known way,
every other attempt passes) and the helpers they use. The answers are decided from the request
alone (the seed's instruction, the sampling seed, whether it is a repair conversation), so a
test or benchmark knows exactly which chains fail, why, and what their pairs are. In the
package (not the tests) so ``bench/regen_bench.py`` uses the same script.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

FIRST_SEED = 100
"""``provider.seed`` of the tests: sample 0's first attempt is sent with this seed."""

FAILED_STORY = "The end."
"""One sentence and none of the required phrases: wrong_sentence_count and missing_required."""

_LENGTH = re.compile(r"Length: (\d+) to (\d+) sentences")


def instruction_of(messages: list[Mapping[str, Any]]) -> str:
    """The seed's instruction: the first user turn (a repair conversation keeps it first)."""
    return next(str(m["content"]) for m in messages if m.get("role") == "user")


def passing_story(instruction: str) -> str:
    """A story meeting the instruction: each required phrase in its own sentence, the fewest
    sentences allowed, no banned phrase (the filler words are none of the pools' phrases)."""
    match = _LENGTH.search(instruction)
    if match is None:
        raise ValueError("not a canonical TinyStories instruction (no 'Length: N to M sentences')")
    low = int(match.group(1))
    lines = instruction.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("- Must include ALL"))
    required: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith("  - "):
            break
        required.append(line[4:])
    sentences = [f"Zob saw {phrase}" for phrase in required]
    sentences += ["Zob hummed"] * max(0, low - len(sentences))
    return ". ".join(sentences) + "."


def is_repair(body: Mapping[str, Any]) -> bool:
    """The request is a repair conversation (it holds an assistant turn)."""
    return any(m.get("role") == "assistant" for m in body["messages"])


def script(body: Mapping[str, Any]) -> str:
    """Sample 0's first attempt fails (:data:`FAILED_STORY`); everything else passes."""
    messages = list(body["messages"])
    if body.get("seed") == FIRST_SEED and not is_repair(body):
        return FAILED_STORY
    return passing_story(instruction_of(messages))
