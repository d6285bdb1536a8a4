"""The judge's side of a TinyStories answer: its messages (engine-rendered) and its verdict.

Takes: a seed record, the seed's instruction, an answer, and a ``tinystories_judge`` template
(by default the packaged ``conf/template/tinystories_judge_safety.yaml``). Gives:
:data:`JUDGE_TASK` (the ``tinystories_judge`` task kind: the seed's fields, ``instruction`` and
``answer``), :class:`JudgeRenderer` (the judge request's messages) and :func:`read_verdict`,
which parses a judge's answer as JSON and validates it against the verdict schema, and
:func:`error_kind`, the short kind of a judge error that the log and the report count.

Why validate although the server was given the schema: not every server enforces it (an
OpenAI-compatible server may ignore ``response_format``; a truncated answer breaks any
grammar), and a verdict is data the exports depend on: an answer that is not a valid verdict
is never guessed at; the caller asks again and finally records a judge error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storyforge import jsontext
from storyforge.engine.sources import SourceSpec
from storyforge.errors import DataError
from storyforge.tasks.base import register_field_kind
from storyforge.tasks.tinystories.instruction import KindRenderer
from storyforge.tasks.tinystories.kind import SOURCES as SEED_SOURCES
from storyforge.tasks.tinystories.kind import ConstraintFields

__all__ = ["JUDGE_TASK", "JudgeContext", "JudgeRenderer", "Verdict", "error_kind", "read_verdict"]

TEMPLATE_FILE = "template/tinystories_judge_safety.yaml"


class JudgeContext(ConstraintFields):
    """The render context of a judge request."""

    instruction: str
    answer: str


SOURCES: tuple[SourceSpec, ...] = (
    *SEED_SOURCES,
    SourceSpec(name="instruction", returns="str", description="The instruction the story was written for."),
    SourceSpec(name="answer", returns="str", description="The story to judge (the model's answer)."),
)

JUDGE_TASK = register_field_kind(
    "tinystories_judge",
    JudgeContext,
    SOURCES,
    "A judge model's request about one TinyStories answer.",
    required=True,
)


class JudgeRenderer(KindRenderer):
    """A compiled ``tinystories_judge`` template; calling it renders one judge request's messages."""

    __slots__ = ()
    KIND = JUDGE_TASK
    DEFAULT_FILE = TEMPLATE_FILE

    def __call__(self, seed: Mapping[str, Any], answer: str) -> tuple[dict[str, str], ...]:
        context = JudgeContext(
            protagonist=str(seed.get("protagonist", "")),
            theme=str(seed.get("theme", "")),
            required=list(seed.get("required") or ()),
            banned=list(seed.get("banned") or ()),
            min_sentences=int(seed.get("min_sentences", 0)),
            max_sentences=int(seed.get("max_sentences", 0)),
            instruction=str(seed.get("instruction", "")),
            answer=answer,
        )
        result = self._render(self._compiled, context, self._registry)
        if result.warnings:
            raise DataError(f"template {self.name!r}: " + "; ".join(result.warnings))
        if not result.messages or result.messages[-1]["role"] != "user":
            raise DataError(f"template {self.name!r} must end with a user message")
        return tuple({"role": m["role"], "content": m["content"]} for m in result.messages)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A judge's valid verdict: ``passed`` and, for a fail, the rule and the reason."""

    passed: bool
    rule: str
    reason: str
    score: float | None = None

    def as_record(self) -> dict[str, Any]:
        return {"verdict": "pass" if self.passed else "fail", "rule": self.rule, "reason": self.reason} | (
            {"score": self.score} if self.score is not None else {}
        )


#: A verdict is a small object: longer answers, deeper nesting or longer numbers are not one,
#: and are refused before a schema validator or ``float`` walks them.
MAX_VERDICT_CHARS = 65_536
MAX_VERDICT_DEPTH = 32
MAX_NUMBER_DIGITS = 30


def _beyond_limits(value: Any) -> str | None:
    """Why ``value`` (a parsed verdict) is past the limits above, or None; walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_VERDICT_DEPTH:
                return f"nested deeper than a verdict may be (at most {MAX_VERDICT_DEPTH} levels)"
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, int) and not isinstance(item, bool):
            if abs(item) >= 10**MAX_NUMBER_DIGITS:
                return f"a number longer than a verdict may hold (at most {MAX_NUMBER_DIGITS} digits)"
        elif isinstance(item, float) and not math.isfinite(item):
            return "a number too large for a verdict"
    return None


def read_verdict(text: object, schema: Mapping[str, Any]) -> Verdict | str:
    """The verdict in ``text``, or why it is not one (not JSON, not valid under ``schema``)."""
    from jsonschema import Draft202012Validator

    if not isinstance(text, str):
        return "the judge gave no text"
    if len(text) > MAX_VERDICT_CHARS:
        return f"longer than a verdict may be ({len(text):,} characters, at most {MAX_VERDICT_CHARS:,})"
    try:
        value = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at column {exc.colno})"
    beyond = _beyond_limits(value)
    if beyond:
        return beyond
    errors = sorted(Draft202012Validator(dict(schema)).iter_errors(value), key=lambda e: list(e.path))
    if errors:
        where = "/".join(map(str, errors[0].path)) or "the verdict"
        return f"not valid under judge.schema ({where}: {errors[0].message})"
    verdict = value.get("verdict") if isinstance(value, dict) else None
    if verdict not in ("pass", "fail"):
        return f"verdict must be 'pass' or 'fail', got {verdict!r}"
    score = value.get("score")
    return Verdict(
        passed=verdict == "pass",
        rule=str(value.get("rule", "")),
        reason=str(value.get("reason", "")),
        score=float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
    )


_NO_VERDICT = re.compile(r"^no valid verdict after \d+ request\(s\): ")


def error_kind(error: str) -> str:
    """The kind of a judge error, for counting: ``not JSON``, ``not valid under judge.schema``,
    ``the judge request failed``, ... (its text up to the first detail)."""
    text = _NO_VERDICT.sub("", error)
    cut = min(
        (i for i in (text.find(" ("), text.find(": "), text.find(", got ")) if i > 0), default=len(text)
    )
    return text[:cut] or "unknown"
